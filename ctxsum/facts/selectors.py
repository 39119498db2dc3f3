"""Reads of key facts: what a conversation sees and which of it the facts block shows, a
subject's facts. A fixed number of queries however many facts there are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import F, QuerySet

from ctxsum.facts.block import facts_budget, facts_chosen, facts_visible
from ctxsum.facts.models import FACT_ORDER, Fact
from ctxsum.models import Conversation


def _annotated(facts: QuerySet[Fact]) -> QuerySet[Fact]:
    """With ``summary_version``: the version of the summary that wrote the value (None: a
    person's), in the same query."""
    return facts.annotate(summary_version=F("summary__version")).order_by(*FACT_ORDER)


@dataclass(frozen=True, kw_only=True)
class FactsSeen:
    """The facts a conversation sees, and the ids of those its facts block shows now."""

    facts: list[Fact]
    shown: frozenset[int]

    def get(self, pk: int) -> Fact:
        """The fact ``pk`` among them; Fact.DoesNotExist when it is not one."""
        for fact in self.facts:
            if fact.pk == pk:
                return fact
        raise Fact.DoesNotExist(pk)


def conversation_facts(*, conversation: Conversation) -> FactsSeen:
    """The facts ``conversation`` sees, and which of them its block shows (one query)."""
    facts = list(_annotated(facts_visible(conversation)))
    model, budget = conversation.model or None, facts_budget(conversation)
    chosen = facts_chosen(facts, model=model, budget=budget)
    return FactsSeen(facts=facts, shown=frozenset(fact.pk for fact in chosen))


def subject_facts(*, owner: Any, subject: str) -> QuerySet[Fact]:
    """``owner``'s facts of ``subject`` (not those of a conversation naming it)."""
    return _annotated(Fact.objects.of_subject(owner.pk, subject))
