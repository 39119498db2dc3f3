"""The chat turn's reads: the usage a conversation's turns reported, added to its stats
through ``ctxsum.hooks.contribute_stats``."""

from __future__ import annotations

from django.db.models import Count, Sum

from ctxsum.chat.models import ChatTurn
from ctxsum.models import Conversation

__all__ = ["chat_usage"]


def chat_usage(*, conversation: Conversation) -> dict[str, int]:
    """The conversation's chat turns and the tokens they used, as the provider reported
    them (a turn it reported nothing for adds nothing). One query."""
    totals = ChatTurn.objects.filter(conversation=conversation).aggregate(
        chat_turns=Count("id"),
        prompt_tokens=Sum("prompt_tokens"),
        completion_tokens=Sum("completion_tokens"),
        cached_tokens=Sum("cached_tokens"),
    )
    return {key: value or 0 for key, value in totals.items()}
