"""The chat app's admin, read-only: the stored turns and each conversation's chat state,
found by the admin's autodiscovery of the app."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin

from ctxsum.admin.base import ConversationRowMixin
from ctxsum.chat.models import ChatState, ChatTurn

if TYPE_CHECKING:
    TurnModelAdmin = admin.ModelAdmin[ChatTurn]
    StateModelAdmin = admin.ModelAdmin[ChatState]
else:
    TurnModelAdmin = StateModelAdmin = admin.ModelAdmin


@admin.register(ChatTurn)
class ChatTurnAdmin(ConversationRowMixin, TurnModelAdmin):
    list_display = (
        "created",
        "conversation_title",
        "model",
        "attempts",
        "fallbacks",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "latency_ms",
        "streamed",
    )
    list_filter = ("model", "streamed", "finish_reason")
    search_fields = ("conversation__id", "conversation__title", "model")
    readonly_fields = [field.name for field in ChatTurn._meta.fields]


@admin.register(ChatState)
class ChatStateAdmin(ConversationRowMixin, StateModelAdmin):
    list_display = ("conversation_title", "chat_calls", "turn_owner", "turn_started_at")
    search_fields = ("conversation__id", "conversation__title")
    readonly_fields = [field.name for field in ChatState._meta.fields]
