"""Conversations: the list annotated with what a reviewer sorts and filters on, an edit
form that saves through ``conversation_update``, the review page, and actions that call the
compaction, rebuild and revert services one conversation at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Exists, Model, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.text import Truncator, capfirst
from django.utils.timesince import timesince
from django.utils.timezone import localtime
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ctxsum import services
from ctxsum.admin import actions as batch
from ctxsum.admin import filters, queries, views
from ctxsum.admin.base import (
    ConversationModelAdmin,
    RefusalMixin,
    ReviewMediaMixin,
    badge,
    conversation_link,
)
from ctxsum.admin.forms import EDITABLE, ConversationForm
from ctxsum.hooks import conversation_rows
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.selectors import conversation_effective_policy

COMPACT_ALL = "manage.py ctxsum_compact --all --force"
REBUILD_ALL = "manage.py ctxsum_rebuild --stale"
REVERT_MANY = "manage.py ctxsum_revert ID…"


@admin.register(Conversation)
class ConversationAdmin(RefusalMixin, ReviewMediaMixin, ConversationModelAdmin):
    form = ConversationForm
    # Readable at 1,280 px beside the admin's navigation and the filters: the owner and the
    # source go under the title.
    list_display = (
        "conversation",
        "message_total",
        "summaries",
        "active_tokens_label",
        "tokens_saved_label",
        "last_compaction",
        "queued",
    )
    list_display_links = None  # the title links the review page, which links the edit form
    list_filter = (
        filters.HasSummariesFilter,
        filters.StaleConversationFilter,
        filters.LastOutcomeFilter,
        filters.SourceFilter,
    )
    list_per_page = 50
    show_full_result_count = False
    search_fields = ("title", "id")
    search_help_text = _("Title, id, owner, or words in a message.")
    fieldsets = (
        (None, {"fields": ("title", "owner", "model", "subject", "metadata")}),
        (
            _("Policy"),
            {
                "fields": ("trigger", "keep", "max_context_tokens", "effective_policy"),
                "description": _(
                    "Overrides of the settings' TRIGGER, KEEP and MAX_CONTEXT_TOKENS, each "
                    "replacing its default as a whole; checked like the REST API does."
                ),
            },
        ),
        (
            _("Counters"),
            {
                "fields": (
                    ("message_count", "active_message_count", "next_seq"),
                    ("active_tokens", "facts_tokens", "revision"),
                    ("lease_owner", "leased_at"),
                    ("created_at", "updated_at"),
                    "id",
                )
            },
        ),
    )
    readonly_fields = tuple(name for name in flatten_fieldsets(fieldsets) if name not in EDITABLE)
    actions = ("compact_now", "compact_dry_run", "rebuild_stale", "revert_last")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Conversation]:
        return queries.conversation_rows(super().get_queryset(request))

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        # The owner by the name they log in with, whatever the user model calls that field.
        return (*self.search_fields, f"owner__{get_user_model().USERNAME_FIELD}")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Conversation], search_term: str
    ) -> tuple[QuerySet[Conversation], bool]:
        """Also the conversations with a message holding the whole search term."""
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if term:
            said = Message.objects.containing(term).filter(conversation=OuterRef("pk"))
            results = results | queryset.filter(Exists(said))
        return results, may_have_duplicates

    @admin.display(description=_("conversation"), ordering="title")
    def conversation(self, obj: Conversation) -> str:
        """The title, linking the review page; under it the owner and the source."""
        source = getattr(obj, "source", None) or ""
        return format_html(
            '{}<br><small class="ctxsum-muted" title="{}">{}{}{}</small>',
            conversation_link(obj, chars=60),
            source,
            obj.owner,
            " · " if source else "",
            Truncator(source).chars(30),
        )

    @admin.display(description=_("messages"), ordering="message_count")
    def message_total(self, obj: Conversation) -> int:
        return obj.message_count

    @admin.display(description=_("summaries"), ordering="summary_total")
    def summaries(self, obj: Conversation) -> int:
        return int(getattr(obj, "summary_total", 0))

    @admin.display(description=_("tokens"), ordering="active_tokens")
    def active_tokens_label(self, obj: Conversation) -> str:
        return f"{obj.context_tokens:,}"

    @admin.display(description=_("saved"), ordering="tokens_saved")
    def tokens_saved_label(self, obj: Conversation) -> str:
        return f"{getattr(obj, 'tokens_saved', 0):,}"

    @admin.display(description=_("last compaction"), ordering="last_attempt_at")
    def last_compaction(self, obj: Conversation) -> str:
        """The last attempt's outcome, and how long ago (the time itself on hover)."""
        outcome = getattr(obj, "last_outcome", None)
        if outcome is None:
            return str(self.get_empty_value_display())
        when = localtime(obj.last_attempt_at)  # type: ignore[attr-defined]
        return format_html(
            '<span class="ctxsum-badge ctxsum-{}">{}</span><br>'
            '<small class="ctxsum-muted" title="{}">{}</small>',
            outcome,
            CompactionAttempt.Outcome(outcome).label,
            date_format(when, "DATETIME_FORMAT"),
            gettext("%(time)s ago") % {"time": timesince(when, depth=1)},
        )

    @admin.display(description=_("queued"))
    def queued(self, obj: Conversation) -> str:
        """How long a compaction task has waited without running, once over a minute."""
        queued_at = services.compaction_queued_at(obj, getattr(obj, "last_attempt_at", None))
        if queued_at is None:
            return str(self.get_empty_value_display())
        hint = gettext("Not run yet: is a task worker running?")
        return badge("failed", timesince(queued_at, depth=1), hint)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # conversations come from the API and the services

    @admin.display(description=_("policy in force"))
    def effective_policy(self, obj: Conversation) -> str:
        policy = conversation_effective_policy(obj)
        return ", ".join(f"{name}: {value}" for name, value in policy.items())

    def save_model(self, request: HttpRequest, obj: Conversation, form: Any, change: bool) -> None:
        services.conversation_update(conversation=obj, **form.changes())

    def delete_model(self, request: HttpRequest, obj: Conversation) -> None:
        services.conversation_delete(conversation=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        for conversation in queryset:
            services.conversation_delete(conversation=conversation)

    def get_deleted_objects(
        self, objs: Iterable[Conversation], request: HttpRequest
    ) -> tuple[list[Any], dict[Any, int], set[Any], list[Any]]:
        """What a delete takes with it, counted rather than listed (a conversation may hold
        thousands of messages): one query per kind, the installed apps' kinds included
        (``hooks.deleted_with_conversation``). The rows go with their conversation, so no
        permission on them is needed."""
        conversations = list(objs)
        ids = [conversation.pk for conversation in conversations]
        kinds: list[type[Model]] = [Message, Summary, CompactionAttempt, *conversation_rows()]
        counts = {Conversation._meta.verbose_name_plural: len(conversations)}
        for model in kinds:
            rows = model._default_manager.filter(conversation__in=ids)
            counts[model._meta.verbose_name_plural] = rows.count()
        name = capfirst(Conversation._meta.verbose_name)
        listed = [f"{name}: {conversation}" for conversation in conversations]
        return listed, counts, set(), []

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        urls = super().get_urls()
        for url in urls:
            if url.name == "{}_{}_changelist".format(*info):
                # The actions call the summarizer: never inside ATOMIC_REQUESTS' transaction.
                transaction.non_atomic_requests(url.callback)
        pages: list[tuple[str, str, Callable[..., HttpResponse]]] = [
            ("review", "review/", views.conversation_review),
            ("redact", "messages/<int:seq>/redact/", views.message_redact),
            ("revert", "summaries/<int:version>/revert/", views.summary_revert),
        ]
        return [
            path(
                f"<path:object_id>/{route}",
                wrap(partial(page, self)),
                name="{}_{}_{}".format(*info, name),
            )
            for name, route, page in pages
        ] + urls

    @admin.action(description=_("Compact now (force)"), permissions=["change"])
    def compact_now(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        self._run(request, queryset, partial(batch.compact, dry_run=False), COMPACT_ALL)

    @admin.action(description=_("Dry run: what compaction would do"), permissions=["view"])
    def compact_dry_run(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        self._run(request, queryset, partial(batch.compact, dry_run=True), COMPACT_ALL)

    @admin.action(description=_("Rebuild stale summary"), permissions=["change"])
    def rebuild_stale(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        self._run(request, queryset, batch.rebuild, REBUILD_ALL)

    @admin.action(description=_("Undo the last compaction"), permissions=["change"])
    def revert_last(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        self._run(request, queryset, batch.revert, REVERT_MANY)

    def _run(
        self,
        request: HttpRequest,
        queryset: QuerySet[Conversation],
        work: Callable[[QuerySet[Conversation]], batch.Tally],
        command: str,
    ) -> None:
        """``work`` over the selection, if it is small enough to run inside a request."""
        if queryset.count() > batch.ACTION_LIMIT:
            text = gettext(
                "Select at most %(limit)d conversations at a time; for more, run “%(command)s”."
            )
            values = {"limit": batch.ACTION_LIMIT, "command": command}
            self.message_user(request, text % values, messages.ERROR)
            return
        tally = work(queryset.order_by("created_at", "pk"))
        self.message_user(request, tally.summary(), tally.level)
        for note in tally.notes:
            self.message_user(request, note, messages.INFO)
