"""The example project's own pages: the chat page, the quickest way to see ctxsum work."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from ctxsum import selectors
from ctxsum.conf import ctxsum_settings


@login_required
@ensure_csrf_cookie
def chat(request: HttpRequest) -> HttpResponse:
    """One page: the user's conversations, a chat that streams its replies through
    ``POST /api/conversations/{id}/chat/``, and the active context beside it. Everything
    after the first render is the REST API, called from the page with the session."""
    conversations = selectors.conversation_list(owner=request.user)[:50]
    chosen = request.GET.get("c") or (str(conversations[0].pk) if conversations else "")
    return render(
        request,
        "chat.html",
        {
            "conversations": conversations,
            "chosen": chosen,
            "model": ctxsum_settings.DEFAULT_MODEL,
        },
    )
