"""Reads of key facts: what a conversation sees and which of it the facts block shows, a
subject's facts. A fixed number of queries, and a bounded read, however many facts there
are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import F, QuerySet

from ctxsum.facts.block import facts_block, facts_visible
from ctxsum.facts.models import FACT_ORDER, Fact
from ctxsum.models import Conversation


def _annotated(facts: QuerySet[Fact]) -> QuerySet[Fact]:
    """With ``summary_version``: the version of the summary that wrote the value (None: a
    person's), in the same query."""
    return facts.annotate(summary_version=F("summary__version")).order_by(*FACT_ORDER)


@dataclass(frozen=True, kw_only=True)
class FactsSeen:
    """The facts a conversation sees (not read yet: a list pages them), and the ids of
    those its facts block shows now."""

    facts: QuerySet[Fact]
    shown: frozenset[int]

    def get(self, pk: int) -> Fact:
        """The fact ``pk`` among them (one query); Fact.DoesNotExist when it is not one."""
        return self.facts.get(pk=pk)


def conversation_facts(*, conversation: Conversation) -> FactsSeen:
    """The facts ``conversation`` sees, and which of them its block shows (the block's
    read: at most ``candidates_limit`` facts, however many it sees)."""
    block = facts_block(conversation)
    shown = frozenset(fact.pk for fact in block.shows) if block is not None else frozenset()
    return FactsSeen(facts=_annotated(facts_visible(conversation)), shown=shown)


def subject_facts(*, owner: Any, subject: str) -> QuerySet[Fact]:
    """``owner``'s facts of ``subject`` (not those of a conversation naming it)."""
    return _annotated(Fact.objects.of_subject(owner.pk, subject))
