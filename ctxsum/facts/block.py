"""The facts block of a context: one user message after the summary showing a
conversation's own facts and its subject's, in ``FACT_ORDER``, as many as
``FACTS_MAX_TOKENS`` allows; its tokens count in ``active_tokens`` (``facts_tokens`` is
its share), kept up to date whenever facts change.

Lock order (docs/architecture.md, "Key facts"): the owner's user row first, FOR NO KEY
UPDATE (``facts.services.owner_lock``), then the conversations that show the facts being
changed, in primary-key order (``conversations_lock``), then a fact's own row. Each step is
optional, none is taken out of this order.
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import Q, QuerySet

from ctxsum import tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.facts.lines import FACTS_HEADER, fact_line, fact_tokens
from ctxsum.facts.models import FACT_ORDER, Fact
from ctxsum.hooks import Block
from ctxsum.models import Conversation

FACTS_BLOCK = "facts"
# What a recount changes on the conversation row.
BLOCK_FIELDS = ("facts_tokens", "active_tokens", "revision", "updated_at")
# The fewest tokens a fact's line can cost ("- k: v" and its newline): how many facts a block
# of FACTS_MAX_TOKENS could ever show.
MIN_LINE_TOKENS = 3


def facts_visible(conversation: Conversation) -> QuerySet[Fact]:
    """The conversation's own facts and its subject's, in ``FACT_ORDER``."""
    facts = Fact.objects.using(conversation._state.db)
    visible = facts.filter(conversation=conversation)
    if conversation.subject:
        visible |= facts.of_subject(conversation.owner_id, conversation.subject)
    return visible.order_by(*FACT_ORDER)


def block_order(fact: Fact) -> tuple[bool, int, str, float]:
    """``FACT_ORDER`` as a sort key. A fact not stored yet (a merge's new one) comes after
    the stored ones of its key: it will have the larger id."""
    confirmed = fact.confirmed_at
    micros = calendar.timegm(confirmed.utctimetuple()) * 1_000_000 + confirmed.microsecond
    pk: int | None = fact.pk
    return (not fact.pinned, -micros, fact.key, math.inf if pk is None else pk)


def candidates_limit() -> int:
    """How many facts, in block order, a block is chosen from: as many as could fit, each
    key twice (the conversation's own and its subject's)."""
    return 2 * (max(ctxsum_settings.FACTS_MAX_TOKENS, 0) // MIN_LINE_TOKENS + 1)


def facts_candidates(conversation: Conversation) -> QuerySet[Fact]:
    """The facts the conversation's block is chosen from (one query)."""
    return facts_visible(conversation)[: candidates_limit()]


def one_per_key(facts: Iterable[Fact]) -> dict[str, Fact]:
    """``facts`` by key, one each: where a conversation's own fact and its subject's share a
    key, its own (the one its block shows, and the one the summarizer writes to)."""
    by_key: dict[str, Fact] = {}
    for fact in facts:
        kept = by_key.get(fact.key)
        if kept is None or (kept.conversation_id is None and fact.conversation_id is not None):
            by_key[fact.key] = fact
    return by_key


def facts_chosen(ordered: Sequence[Fact], *, model: str | None = None) -> list[Fact]:
    """The facts the block shows, in its order, from those the conversation sees in
    ``FACT_ORDER`` (at least the first ``candidates_limit()``): one per key, while the block
    stays within FACTS_MAX_TOKENS (a shorter fact after one that does not fit may)."""
    limit = ctxsum_settings.FACTS_MAX_TOKENS
    candidates = one_per_key(ordered[: candidates_limit()]).values()
    chosen: list[Fact] = []
    used = tokens.count_message({"role": "user", "content": FACTS_HEADER}, model=model)
    for fact in sorted(candidates, key=block_order):
        if used + fact.token_count <= limit:
            chosen.append(fact)
            used += fact.token_count
    # Line counts are taken one by one; drop from the end while the whole block is over.
    while chosen and block_tokens(chosen, model=model) > limit:
        chosen.pop()
    return chosen


def facts_block(conversation: Conversation) -> Block | None:
    """The conversation's facts block as its facts stand now (one query); None when it shows
    no fact. The context's "facts" block contributor."""
    model = conversation.model or None
    facts = facts_chosen(list(facts_candidates(conversation)), model=model)
    if not facts:
        return None
    message, size = block_message(facts), block_tokens(facts, model=model)
    return Block(kind=FACTS_BLOCK, message=message, tokens=size, shows=facts)


def block_message(facts: Sequence[Fact]) -> dict[str, Any]:
    """The block as it enters the context: a user message, like the summary."""
    lines = [FACTS_HEADER, *(fact_line(fact.key, fact.value) for fact in facts)]
    return {"role": "user", "content": "\n".join(lines)}


def block_tokens(facts: Sequence[Fact], *, model: str | None = None) -> int:
    """Tokens of the block as a context message; 0 when it shows no fact (no block)."""
    if not facts:
        return 0
    return tokens.count_message(block_message(facts), model=model)


def line_tokens(fact: Fact, *, model: str | None) -> int:
    """``fact``'s ``token_count``: its line counted with its conversation's ``model``, or for
    a subject's fact (shown with any model) DEFAULT_MODEL's encoding."""
    own = fact.conversation_id is not None
    return fact_tokens(fact.key, fact.value, model=model if own else None)


def conversations_lock(
    *, db: str, owner_id: Any, subject: str = "", conversation_id: Any = None
) -> list[Conversation]:
    """Lock, in primary-key order, the conversations that show a fact: ``conversation_id``'s
    and every one of the owner's naming ``subject``. Inside the caller's transaction."""
    shown = Q(pk=conversation_id) if conversation_id is not None else Q(pk__in=[])
    if subject:
        shown |= Q(owner_id=owner_id, subject=subject)
    return list(Conversation.objects.using(db).select_for_update().filter(shown).order_by("pk"))


def facts_count(conversation: Conversation) -> int:
    """Tokens of the conversation's facts block as its facts stand now (one query)."""
    block = facts_block(conversation)
    return block.tokens if block is not None else 0


def own_block(conversation: Conversation, count: int) -> None:
    """Set the conversation's counters (not saved) to a facts block of ``count`` tokens."""
    conversation.active_tokens += count - conversation.facts_tokens
    conversation.facts_tokens = count


def facts_recount(locked: Sequence[Conversation], *, changed: bool = False) -> None:
    """Recount the facts block of each conversation (locked by the caller), saving those
    whose size changed, or all with ``changed`` (facts they show were written), with their
    ``revision`` moved."""
    for conversation in locked:
        count = facts_count(conversation)
        if count == conversation.facts_tokens and not changed:
            continue
        own_block(conversation, count)
        conversation.revision += 1
        conversation.save(update_fields=BLOCK_FIELDS)
