"""The chat app's admin, read-only: the stored turns (the model that answered, its attempts
and fallbacks, the usage the provider reported) and each conversation's chat state (its
calls and its turn lock). Found by the admin's autodiscovery of the app."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ctxsum.admin.base import ReadOnlyMixin, conversation_link, short_time
from ctxsum.chat.models import ChatState, ChatTurn

if TYPE_CHECKING:
    TurnModelAdmin = admin.ModelAdmin[ChatTurn]
    StateModelAdmin = admin.ModelAdmin[ChatState]
else:
    TurnModelAdmin = StateModelAdmin = admin.ModelAdmin


@admin.register(ChatTurn)
class ChatTurnAdmin(ReadOnlyMixin, TurnModelAdmin):
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
    list_select_related = ("conversation",)
    list_per_page = 50
    show_full_result_count = False
    search_fields = ("conversation__id", "conversation__title", "model")
    readonly_fields = [field.name for field in ChatTurn._meta.fields]

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: ChatTurn) -> str:
        return short_time(obj.created_at)

    @admin.display(description=_("conversation"), ordering="conversation__title")
    def conversation_title(self, obj: ChatTurn) -> str:
        return conversation_link(obj.conversation, chars=32)


@admin.register(ChatState)
class ChatStateAdmin(ReadOnlyMixin, StateModelAdmin):
    list_display = ("conversation_title", "chat_calls", "turn_owner", "turn_started_at")
    list_select_related = ("conversation",)
    list_per_page = 50
    show_full_result_count = False
    search_fields = ("conversation__id", "conversation__title")
    readonly_fields = [field.name for field in ChatState._meta.fields]

    @admin.display(description=_("conversation"), ordering="conversation__title")
    def conversation_title(self, obj: ChatState) -> str:
        return conversation_link(obj.conversation, chars=32)
