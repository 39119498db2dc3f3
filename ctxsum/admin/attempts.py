"""Compaction attempts: read-only, the record of every compaction and rebuild, including
the ones that failed, conflicted or were skipped."""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ctxsum.admin.base import AttemptModelAdmin, ConversationRowMixin, badge
from ctxsum.models import CompactionAttempt


@admin.register(CompactionAttempt)
class CompactionAttemptAdmin(ConversationRowMixin, AttemptModelAdmin):
    list_display = (
        "created",
        "conversation_title",
        "outcome_label",
        "reason_label",
        "tokens",
        "archived",
    )
    list_filter = ("outcome", "reason", "forced")
    search_fields = ("conversation__id", "conversation__title", "error")
    readonly_fields = [field.name for field in CompactionAttempt._meta.fields]

    @admin.display(description=_("outcome"), ordering="outcome")
    def outcome_label(self, obj: CompactionAttempt) -> str:
        return badge(obj.outcome, obj.get_outcome_display(), obj.error)

    @admin.display(description=_("reason"), ordering="reason")
    def reason_label(self, obj: CompactionAttempt) -> str:
        return f"{obj.reason} ({_('forced')})" if obj.forced else obj.reason

    @admin.display(description=_("tokens"), ordering="tokens_before")
    def tokens(self, obj: CompactionAttempt) -> str:
        if not obj.tokens_before:
            return str(self.get_empty_value_display())
        return f"{obj.tokens_before:,} \N{RIGHTWARDS ARROW} {obj.tokens_after:,}"

    @admin.display(description=_("archived"), ordering="messages_archived")
    def archived(self, obj: CompactionAttempt) -> int:
        return obj.messages_archived
