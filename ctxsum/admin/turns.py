"""Chat turns: read-only, one row per stored turn with the model that answered, its attempts
and fallbacks, and the usage the provider reported."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ctxsum.admin.base import ReadOnlyMixin, conversation_link, short_time
from ctxsum.models import ChatTurn

if TYPE_CHECKING:
    TurnModelAdmin = admin.ModelAdmin[ChatTurn]
else:
    TurnModelAdmin = admin.ModelAdmin


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
