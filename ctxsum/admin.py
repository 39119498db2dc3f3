"""The admin: review conversations, their transcripts and summaries; actions call services."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ctxsum.exceptions import SummarizerError
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.services.compaction import conversation_compact

if TYPE_CHECKING:
    # The admin classes are generic in django-stubs only: subscripted for mypy, bare at run time.
    _ConversationAdmin = admin.ModelAdmin[Conversation]
    _SummaryAdmin = admin.ModelAdmin[Summary]
    _MessageAdmin = admin.ModelAdmin[Message]
    _AttemptAdmin = admin.ModelAdmin[CompactionAttempt]
    _MessageInline = admin.TabularInline[Message, Model]
    _SummaryInline = admin.TabularInline[Summary, Conversation]
else:
    _ConversationAdmin = _SummaryAdmin = _MessageAdmin = _AttemptAdmin = admin.ModelAdmin
    _MessageInline = _SummaryInline = admin.TabularInline


class NoAddMixin:
    """Rows are written by the services only: the admin never adds one."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# Shown under a Conversation and under a Summary.
class MessageInline(NoAddMixin, _MessageInline):
    model = Message
    fields = ("seq", "role", "content", "tool_call_id", "token_count", "summary", "replaced_at")
    readonly_fields = fields
    ordering = ("seq",)
    extra = 0
    can_delete = False
    show_change_link = True


class SummaryInline(NoAddMixin, _SummaryInline):
    model = Summary
    fk_name = "conversation"
    fields = ("version", "active", "from_seq", "to_seq", "prompt_version", "model", "text")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(_ConversationAdmin):
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
    search_fields = ("title", "id")
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

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        # The owner by the name they log in with, whatever the user model calls that field.
        return (*self.search_fields, f"owner__{get_user_model().USERNAME_FIELD}")

    def _compact(
        self, request: HttpRequest, queryset: QuerySet[Conversation], *, dry_run: bool
    ) -> None:
        for conversation in queryset:
            try:
                result = conversation_compact(
                    conversation=conversation, force=True, dry_run=dry_run
                )
            except SummarizerError as error:
                self.message_user(request, f"{conversation}: {error}", messages.ERROR)
                continue
            plan = result.plan
            values: dict[str, object] = {"conversation": conversation, "reason": result.reason}
            text = gettext("%(conversation)s: %(reason)s")
            if plan is not None:
                values.update(before=plan.tokens_before, after=plan.tokens_after)
                text = gettext("%(conversation)s: %(reason)s (%(before)d -> %(after)d tokens)")
            self.message_user(request, text % values)

    @admin.action(description=_("Compact now (force)"))
    def compact_now(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        self._compact(request, queryset, dry_run=False)

    @admin.action(description=_("Dry run: what compaction would do"))
    def compact_dry_run(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        self._compact(request, queryset, dry_run=True)


@admin.register(Summary)
class SummaryAdmin(NoAddMixin, _SummaryAdmin):
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


@admin.register(Message)
class MessageAdmin(NoAddMixin, _MessageAdmin):
    list_display = ("conversation", "seq", "role", "token_count", "summary", "created_at")
    list_filter = ("role",)
    search_fields = ("conversation__id", "tool_call_id")
    readonly_fields = [field.name for field in Message._meta.fields]
    list_select_related = ("conversation", "summary")


@admin.register(CompactionAttempt)
class CompactionAttemptAdmin(NoAddMixin, _AttemptAdmin):
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
