"""The facts a block is chosen from, read as plain rows: a block reads up to
``candidates_limit`` of them at every context read and shows a few, so only those it shows
become ``Fact`` instances (``as_facts``, the other fields deferred as with ``only``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from django.db.models import QuerySet

from ctxsum.facts.models import Fact


class Line(Protocol):
    """What choosing a block and writing its lines read of a fact: a ``Fact`` or a
    ``Candidate``."""

    @property
    def pk(self) -> Any: ...
    @property
    def conversation_id(self) -> Any: ...
    @property
    def key(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def pinned(self) -> bool: ...
    @property
    def confirmed_at(self) -> datetime: ...
    @property
    def token_count(self) -> int: ...


class Candidate(NamedTuple):
    """A fact as choosing the block reads it; ``hidden`` as ``facts_visible`` annotates it."""

    pk: int
    conversation_id: Any
    key: str
    value: str
    pinned: bool
    confirmed_at: datetime
    token_count: int
    hidden: bool


# The columns of a Candidate but ``hidden``, by attribute name.
COLUMNS = ("id", "conversation_id", "key", "value", "pinned", "confirmed_at", "token_count")


def candidates(facts: QuerySet[Fact]) -> list[Candidate]:
    """``facts`` (annotated with ``hidden``) as candidates, in their order (one query)."""
    return [Candidate(*row) for row in facts.values_list(*COLUMNS, "hidden")]


def as_facts(chosen: Sequence[Candidate], *, db: str) -> list[Fact]:
    """``chosen`` as ``Fact`` instances of database ``db``, only its columns loaded."""
    names = [field.attname for field in Fact._meta.concrete_fields if field.attname in COLUMNS]
    facts = []
    for line in chosen:
        values = {**line._asdict(), "id": line.pk}
        fact = Fact.from_db(db, names, [values[name] for name in names])
        fact.hidden = line.hidden  # type: ignore[attr-defined]
        facts.append(fact)
    return facts
