"""The admin: review conversations, their transcripts and summaries; actions call services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from ctxsum.exceptions import SummarizerError
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.services.compaction import conversation_compact


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("seq", "role", "content", "tool_call_id", "token_count", "summary", "replaced_at")
    readonly_fields = fields
    ordering = ("seq",)
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class SummaryInline(admin.TabularInline):
    model = Summary
    fk_name = "conversation"
    fields = ("version", "active", "from_seq", "to_seq", "prompt_version", "model", "text")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "owner",
        "message_count",
        "active_message_count",
        "active_tokens",
        "revision",
        "created_at",
    )
    list_filter = ("created_at",)
    search_fields = ("title", "id", "owner__username")
    readonly_fields = (
        "id",
        "next_seq",
        "message_count",
        "active_message_count",
        "active_tokens",
        "revision",
        "lease_owner",
        "leased_at",
        "created_at",
        "updated_at",
    )
    raw_id_fields = ("owner",)
    inlines = (SummaryInline, MessageInline)
    actions = ("compact_now", "compact_dry_run")

    def _compact(self, request: HttpRequest, queryset: QuerySet, *, dry_run: bool) -> None:
        for conversation in queryset:
            try:
                result = conversation_compact(
                    conversation=conversation, force=True, dry_run=dry_run
                )
            except SummarizerError as error:
                self.message_user(request, f"{conversation}: {error}", messages.ERROR)
                continue
            plan = result.plan
            detail = f" ({plan.tokens_before} -> {plan.tokens_after} tokens)" if plan else ""
            self.message_user(request, f"{conversation}: {result.reason}{detail}")

    @admin.action(description="Compact now (force)")
    def compact_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._compact(request, queryset, dry_run=False)

    @admin.action(description="Dry run: what compaction would do")
    def compact_dry_run(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._compact(request, queryset, dry_run=True)


@admin.register(Summary)
class SummaryAdmin(admin.ModelAdmin):
    list_display = (
        "conversation",
        "version",
        "active",
        "from_seq",
        "to_seq",
        "prompt_version",
        "model",
        "input_tokens",
        "output_tokens",
        "created_at",
    )
    list_filter = ("active", "prompt_version", "model")
    search_fields = ("conversation__id", "conversation__title", "text")
    readonly_fields = [field.name for field in Summary._meta.fields]
    inlines = (MessageInline,)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("conversation", "seq", "role", "token_count", "summary", "created_at")
    list_filter = ("role",)
    search_fields = ("conversation__id", "tool_call_id")
    readonly_fields = [field.name for field in Message._meta.fields]
    list_select_related = ("conversation", "summary")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(CompactionAttempt)
class CompactionAttemptAdmin(admin.ModelAdmin):
    list_display = (
        "conversation",
        "outcome",
        "reason",
        "tokens_before",
        "tokens_after",
        "messages_archived",
        "created_at",
    )
    list_filter = ("outcome", "reason")
    readonly_fields = [field.name for field in CompactionAttempt._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
