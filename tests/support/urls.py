"""The URLs of ctxsum's endpoints, by their names in ctxsum/api/urls.py."""

from __future__ import annotations

from typing import Any

from django.urls import reverse


def api_url(name: str, conversation: Any = None, **path: Any) -> str:
    """The URL of the endpoint ``ctxsum:<name>``; for ``conversation`` (a Conversation, or
    any id, even a malformed one) where the endpoint is about one conversation, and the
    rest of its ``path`` (a message's ``seq``)."""
    if conversation is None:
        return reverse(f"ctxsum:{name}")
    pk = getattr(conversation, "pk", conversation)
    return reverse(f"ctxsum:{name}", kwargs={"pk": pk, **path})
