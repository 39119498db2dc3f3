"""Summaries: read-only; the list filters on staleness, coverage and origin, and the change
page is the summary's review page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ctxsum.admin import filters, views
from ctxsum.admin.base import ConversationRowMixin, SummaryModelAdmin, badge
from ctxsum.admin.rendering import stale_reasons
from ctxsum.models import Summary

# A summary's state badge: the first of these flags it has set.
STATES = (("active", _("active")), ("reverted", _("reverted")), ("superseded", _("superseded")))


@admin.register(Summary)
class SummaryAdmin(ConversationRowMixin, SummaryModelAdmin):
    list_display = (
        "summary",
        "conversation_title",
        "prompt",
        "coverage_label",
        "covers",
        "created",
    )
    list_filter = (
        filters.StaleSummaryFilter,
        filters.CoverageFilter,
        "origin",
        "active",
        "superseded",
        "reverted",
    )
    ordering = ("-created_at", "-version")
    conversation_chars = 40
    search_fields = ("conversation__id", "conversation__title", "text")

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("conversation", "previous")

    def change_view(
        self, request: HttpRequest, object_id: str, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        """The review page: a summary is never edited."""
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        return views.summary_review(self, request, object_id)

    @admin.display(description=_("summary"), ordering="version")
    def summary(self, obj: Summary) -> str:
        """The version, whether it is the active one (or reverted, or superseded by a
        rebuild), and whether a rebuild wrote it."""
        state = next((badge(flag, label) for flag, label in STATES if getattr(obj, flag)), "")
        origin = badge("rebuild", _("rebuild")) if obj.origin == Summary.Origin.REBUILD else ""
        return format_html("v{} {} {}", obj.version, state, origin)

    @admin.display(description=_("prompt"), ordering="prompt_version")
    def prompt(self, obj: Summary) -> str:
        if reasons := stale_reasons(obj):
            state = badge("stale", _("stale"), "; ".join(reasons))
        else:
            state = badge("current", _("current"))
        return format_html("{} {}", obj.prompt_version, state)

    @admin.display(description=_("coverage"), ordering="coverage")
    def coverage_label(self, obj: Summary) -> str:
        if obj.coverage is None:
            return str(self.get_empty_value_display())
        kind = "low" if obj.coverage < 0.5 else "fair" if obj.coverage < 0.8 else "good"
        return badge(kind, f"{obj.coverage:.0%}")

    @admin.display(description=_("covers"), ordering="to_seq")
    def covers(self, obj: Summary) -> str:
        return f"#{obj.from_seq}-{obj.to_seq}"
