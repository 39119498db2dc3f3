"""The list filters of the conversation, summary and message lists."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from ctxsum.admin import queries
from ctxsum.models import CompactionAttempt, Message, Summary
from ctxsum.selectors import current_prompt, stale_summaries

NEVER = "never"


class _Choices(admin.SimpleListFilter):
    """A filter with choices (``options`` by default); subclasses say what each one keeps."""

    options: tuple[tuple[str, Any], ...] = (("yes", _("Yes")), ("no", _("No")))

    def lookups(self, request: HttpRequest, model_admin: Any) -> Any:
        return self.options

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return None if value is None else self.keep(queryset, value)

    def keep(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        raise NotImplementedError


class _Matching(_Choices):
    """Yes: the rows whose pk is in ``matching()``; no: the others."""

    def matching(self) -> QuerySet[Any]:
        raise NotImplementedError

    def keep(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        if value == "yes":
            return queryset.filter(pk__in=self.matching())
        return queryset.exclude(pk__in=self.matching())


class HasSummariesFilter(_Choices):
    title = _("summaries")
    parameter_name = "has_summaries"
    options = (("yes", _("Some")), ("no", _("None")))

    def keep(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        summarized = Exists(Summary.objects.filter(conversation=OuterRef("pk")))
        return queryset.filter(summarized if value == "yes" else ~summarized)


class StaleConversationFilter(_Matching):
    title = _("stale summary")
    parameter_name = "stale"

    def matching(self) -> QuerySet[Any]:
        return stale_summaries().values("conversation_id")


class LastOutcomeFilter(_Choices):
    title = _("last compaction")
    parameter_name = "last_outcome"
    options = (*CompactionAttempt.Outcome.choices, (NEVER, _("never attempted")))

    def keep(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        if value == NEVER:
            return queryset.filter(last_outcome__isnull=True)
        return queryset.filter(last_outcome=value)


class SourceFilter(_Choices):
    title = _("source")
    parameter_name = "source"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Any:
        return [(source, Truncator(source).chars(40)) for source in queries.source_choices()]

    def keep(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        return queryset.filter(source=value)


class StaleSummaryFilter(_Matching):
    """Stale: written under another prompt than the current one, or covering a message
    redacted since (the active ones want a rebuild; superseded ones stay stale)."""

    title = _("stale")
    parameter_name = "stale"

    def matching(self) -> QuerySet[Any]:
        return Summary.objects.stale(**current_prompt()).values("pk")


class CoverageFilter(_Choices):
    title = _("coverage")
    parameter_name = "coverage"
    options = (
        ("50", _("below 50 %")),
        ("80", _("below 80 %")),
        ("none", _("nothing to check")),
    )

    def keep(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        if value == "none":
            return queryset.filter(coverage__isnull=True)
        if value in ("50", "80"):
            return queryset.filter(coverage__lt=int(value) / 100)
        return queryset


# The states of a message the message list filters on, and the rows in each.
MESSAGE_STATES = {
    "active": (_("active"), lambda: Message.objects.active()),
    "archived": (_("archived"), lambda: Message.objects.archived()),
    "replaced": (_("replaced"), lambda: Message.objects.filter(replaced_at__isnull=False)),
    "redacted": (_("redacted"), lambda: Message.objects.filter(redacted_at__isnull=False)),
}


class MessageStateFilter(_Choices):
    title = _("state")
    parameter_name = "state"
    options = tuple((state, label) for state, (label, _rows) in MESSAGE_STATES.items())

    def keep(self, queryset: QuerySet[Any], value: str) -> QuerySet[Any]:
        if value not in MESSAGE_STATES:
            return queryset
        return queryset.filter(pk__in=MESSAGE_STATES[value][1]().values("pk"))
