"""The key facts on the admin's review pages: a conversation's page lists the facts it sees
(and whether its facts block shows each), a summary's page the facts that version wrote.
Registered with the core's pages (``ctxsum.hooks.contribute_panel``) by the facts' admin
module; each builds its rows in a fixed number of queries."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse

from ctxsum.admin.queries import page_of
from ctxsum.admin.views import may_view
from ctxsum.facts import selectors
from ctxsum.facts.models import Fact, FactChange
from ctxsum.hooks import CONVERSATION_PAGE, SUMMARY_PAGE, Panel, contribute_panel
from ctxsum.models import Conversation, Summary

TEMPLATES = "ctxsum_facts/admin/"

# A fact may come from many messages; the list and the pages link this many, then "…".
SOURCE_LINKS = 10


@dataclass(frozen=True, kw_only=True)
class Source:
    """One message a fact came from, and its place on its conversation's review page."""

    seq: int
    url: str


def fact_sources(fact: Fact, *, limit: int = SOURCE_LINKS) -> list[Source]:
    """The messages ``fact`` came from (the first ``limit``), each linking the message on
    its conversation's review page. No query."""
    if fact.source_conversation_id is None:
        return []
    review = reverse("admin:ctxsum_conversation_review", args=[fact.source_conversation_id])
    seqs = sorted({seq for seq in fact.source_seqs if isinstance(seq, int) and seq >= 0})
    return [Source(seq=seq, url=f"{review}?page={page_of(seq)}#m{seq}") for seq in seqs[:limit]]


@dataclass(frozen=True, kw_only=True)
class FactRow:
    """A fact as the review pages list it: its source links, and whether the conversation's
    facts block shows it (None where that depends on the conversation)."""

    fact: Fact
    in_context: bool | None = None
    change: FactChange | None = None  # on a summary's page: what that version changed

    @cached_property
    def sources(self) -> list[Source]:
        return fact_sources(self.fact)

    @property
    def more_sources(self) -> int:
        return max(0, len(self.fact.source_seqs) - len(self.sources))


def conversation_panel(
    request: HttpRequest, model_admin: admin.ModelAdmin[Any], conversation: Conversation
) -> dict[str, Any]:
    """The facts ``conversation`` sees, each with whether its facts block shows it."""
    seen = selectors.conversation_facts(conversation=conversation)
    return {
        "facts": [FactRow(fact=fact, in_context=fact.pk in seen.shown) for fact in seen.facts],
        "can_view_facts": may_view(model_admin, request, Fact),
    }


def summary_panel(
    request: HttpRequest, model_admin: admin.ModelAdmin[Any], summary: Summary
) -> dict[str, Any] | None:
    """The facts ``summary`` wrote, each with the fact as it is now (one query); None (no
    panel) when it wrote none and skipped none."""
    changes = list(
        FactChange.objects.filter(summary=summary)
        .select_related("fact", "fact__conversation")
        .order_by("fact__key", "pk")
    )
    if not changes and not summary.facts_skipped:
        return None
    return {
        "changes": [FactRow(fact=change.fact, change=change) for change in changes],
        "can_view_facts": may_view(model_admin, request, Fact),
    }


def register() -> None:
    """Join the core's review pages (registering again replaces)."""
    for page, name, context in (
        (CONVERSATION_PAGE, "conversation_panel", conversation_panel),
        (SUMMARY_PAGE, "summary_panel", summary_panel),
    ):
        contribute_panel(page, "facts", Panel(template=f"{TEMPLATES}{name}.html", context=context))
