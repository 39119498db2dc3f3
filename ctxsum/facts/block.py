"""The facts block of a context: one user message after the summary showing a
conversation's own facts and its subject's, in ``FACT_ORDER``, less those whose value the
context carries (``CarriedFact``), as many as ``facts_budget`` allows; its tokens count in
``active_tokens`` (``facts_tokens`` is its share), kept up to date whenever facts change.

Lock order (docs/architecture.md, "Key facts"): the owner's user row first, FOR NO KEY
UPDATE (``facts.services.owner_lock``), then the conversations that show the facts being
changed, in primary-key order (``conversations_lock``), then a fact's own row. Each step is
optional, none is taken out of this order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.db.models import BooleanField, Exists, ExpressionWrapper, F, OuterRef, Q, QuerySet

from ctxsum import tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.coverage import message_texts
from ctxsum.facts.candidates import Candidate, Line, as_facts, candidates
from ctxsum.facts.lines import FACTS_HEADER, carries, fact_line, fact_tokens, normalized
from ctxsum.facts.models import FACT_ORDER, CarriedFact, Fact
from ctxsum.hooks import Block
from ctxsum.models import Conversation, Message, Summary
from ctxsum.selectors import conversation_effective_policy

FACTS_BLOCK = "facts"
# What a recount changes on the conversation row.
BLOCK_FIELDS = ("facts_tokens", "active_tokens", "revision", "updated_at")
# The fewest tokens a fact's line can cost ("- k: v" and its newline): how many facts a block
# of its budget could ever show.
MIN_LINE_TOKENS = 3
# What the last read of a conversation's block found, on its instance: (revision, whether it
# sees any fact, shown or left out).
SEEN = "_ctxsum_facts_seen"
# ``block_order``'s clock: microseconds since these, aware or naive as the value is.
EPOCHS = {True: datetime(1970, 1, 1, tzinfo=UTC), False: datetime(1970, 1, 1)}
MICROSECOND = timedelta(microseconds=1)


def facts_budget(conversation: Conversation) -> int:
    """FACTS_TRIGGER_SHARE of the trigger's tokens (of the ceiling with a messages trigger),
    at most FACTS_MAX_TOKENS (the budget when neither counts tokens)."""
    cap: int = ctxsum_settings.FACTS_MAX_TOKENS
    policy = conversation_effective_policy(conversation)
    base = policy["trigger"].get("tokens") or policy["max_context_tokens"]
    return cap if base is None else min(cap, int(base * ctxsum_settings.FACTS_TRIGGER_SHARE))


def facts_visible(conversation: Conversation) -> QuerySet[Fact]:
    """The conversation's own facts and its subject's, in ``FACT_ORDER``, each with
    ``hidden``: its block leaves it out, its value carried by the context (never a pinned
    one)."""
    facts = Fact.objects.using(conversation._state.db)
    visible = facts.filter(conversation=conversation)
    if conversation.subject:
        visible |= facts.of_subject(conversation.owner_id, conversation.subject)
    carried = CarriedFact.objects.filter(
        conversation=conversation.pk, fact=OuterRef("pk"), value=OuterRef("value")
    )
    hidden = ExpressionWrapper(Q(pinned=False) & Exists(carried), output_field=BooleanField())
    return visible.annotate(hidden=hidden).order_by(*FACT_ORDER)


L = TypeVar("L", bound=Line)


def block_order(fact: Line) -> tuple[bool, int, str, float]:
    """``FACT_ORDER`` as a sort key. A fact not stored yet (a merge's new one) comes after
    the stored ones of its key: it will have the larger id."""
    confirmed = fact.confirmed_at
    micros = (confirmed - EPOCHS[confirmed.tzinfo is not None]) // MICROSECOND
    pk: int | None = fact.pk
    return (not fact.pinned, -micros, fact.key, math.inf if pk is None else pk)


def left_out(fact: Line) -> bool:
    return bool(getattr(fact, "hidden", False))  # as facts_visible annotates it


def candidates_limit(budget: int | None = None, *, shared: bool = True) -> int:
    """How many facts, in block order, a block of ``budget`` tokens (FACTS_MAX_TOKENS) is
    chosen from: as many as could fit, each key twice when ``shared`` (the conversation's
    own and its subject's; a conversation naming no subject has one fact per key)."""
    limit = ctxsum_settings.FACTS_MAX_TOKENS if budget is None else budget
    return (2 if shared else 1) * (max(limit, 0) // MIN_LINE_TOKENS + 1)


def choice_limit(conversation: Conversation) -> int:
    """``candidates_limit`` of the conversation's block."""
    return candidates_limit(facts_budget(conversation), shared=bool(conversation.subject))


def holds_choice(first: Sequence[Line], limit: int) -> bool:
    """Whether ``first``, the first ``2 * limit`` facts a conversation sees in
    ``FACT_ORDER`` (or all of them), hold the ``limit`` its block is chosen from (the first
    in that order, those it leaves out last): unless it is full and leaves out more than
    ``limit`` of them."""
    return len(first) < 2 * limit or sum(not left_out(fact) for fact in first) >= limit


def one_per_key(facts: Iterable[L]) -> dict[str, L]:
    """``facts`` by key, one each: where a conversation's own fact and its subject's share a
    key, its own (the one its block shows, and the one the summarizer writes to)."""
    by_key: dict[str, L] = {}
    for fact in facts:
        kept = by_key.get(fact.key)
        if kept is None or (kept.conversation_id is None and fact.conversation_id is not None):
            by_key[fact.key] = fact
    return by_key


def facts_chosen(
    ordered: Sequence[L],
    *,
    model: str | None = None,
    budget: int | None = None,
    window: int | None = None,
) -> list[L]:
    """The facts the block shows, in its order, from those the conversation sees in
    ``FACT_ORDER``: of the first ``window`` (``candidates_limit()`` of ``budget``), those
    it leaves out last, one per key and not left out, while the block stays within
    ``budget`` (FACTS_MAX_TOKENS; a shorter fact after one that does not fit may)."""
    limit = ctxsum_settings.FACTS_MAX_TOKENS if budget is None else budget
    first = sorted(ordered, key=left_out)[: window or candidates_limit(limit)]
    candidates = [fact for fact in one_per_key(first).values() if not left_out(fact)]
    chosen: list[L] = []
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
    model, budget = conversation.model or None, facts_budget(conversation)
    limit = choice_limit(conversation)
    # The first facts in FACT_ORDER (a walk of the conversation's index, however many it
    # holds) hold those the block is chosen from, unless they leave out too many: then
    # those it leaves out last are read (a sort of all it sees).
    read = candidates(facts_visible(conversation)[: 2 * limit])
    if not holds_choice(read, limit):
        first = facts_visible(conversation).order_by(F("hidden"), *FACT_ORDER)
        read = candidates(first[:limit])
    setattr(conversation, SEEN, (conversation.revision, bool(read)))
    facts = facts_chosen(read, model=model, budget=budget, window=limit)
    if not facts:
        return None
    message, size = block_message(facts), block_tokens(facts, model=model)
    shows = as_facts(facts, db=conversation._state.db or "default")
    return Block(kind=FACTS_BLOCK, message=message, tokens=size, shows=shows)


def block_message(facts: Sequence[Line]) -> dict[str, Any]:
    """The block as it enters the context: a user message, like the summary."""
    lines = [FACTS_HEADER, *(fact_line(fact.key, fact.value) for fact in facts)]
    return {"role": "user", "content": "\n".join(lines)}


def block_tokens(facts: Sequence[Line], *, model: str | None = None) -> int:
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


def facts_seen(conversation: Conversation) -> bool:
    """Whether the conversation sees any fact, shown or not: as the last read of its block
    found it at the instance's revision, else one query."""
    if conversation.facts_tokens:
        return True
    seen = getattr(conversation, SEEN, None)
    if seen is not None and seen[0] == conversation.revision:
        return bool(seen[1])
    return facts_visible(conversation).exists()


def context_text(locked: Conversation, summary: str | None = None) -> str:
    """The text of the context's ``summary`` (None: the active one's) and its kept messages
    (the active ones but the leading one), ``normalized``: what ``carries`` looks in."""
    db = locked._state.db
    if summary is None:
        active = Summary.objects.using(db).filter(conversation=locked, active=True)
        summary = active.values_list("text", flat=True).first() or ""
    rows = Message.objects.using(db).filter(conversation=locked, is_leading=False).active()
    kept = [{"content": c, "tool_calls": t} for c, t in rows.values_list("content", "tool_calls")]
    return normalized("\n".join([summary, *message_texts(kept)]))


def facts_check(locked: Conversation, text: str, *, add: bool = True) -> list[Candidate] | None:
    """Mark which of the first facts ``locked`` sees (twice those its block is chosen from)
    its context ``text`` carries, and return them, in ``FACT_ORDER`` with ``hidden`` set as
    ``facts_visible`` reads it (``facts_count`` chooses the block from them); without
    ``add`` (a redaction only takes text away), only unmark those it no longer carries
    (None). Under ``locked``'s row lock."""
    rows = CarriedFact.objects.using(locked._state.db).filter(conversation=locked)
    if not add:
        rows.exclude(pk__in=[row.pk for row in rows if carries(text, row.value)]).delete()
        return None
    first = candidates(facts_visible(locked)[: 2 * choice_limit(locked)])
    carried = {fact.pk for fact in first if carries(text, fact.value)}
    rows.delete()
    rows.bulk_create(
        CarriedFact(conversation=locked, fact_id=fact.pk, value=fact.value)
        for fact in first
        if fact.pk in carried
    )
    return [fact._replace(hidden=fact.pk in carried and not fact.pinned) for fact in first]


def facts_count(conversation: Conversation, checked: Sequence[Candidate] | None = None) -> int:
    """Tokens of the conversation's facts block as its facts stand now: chosen from what
    ``facts_check`` returned (``checked``) when that holds the facts the block is chosen
    from, else read (one query)."""
    budget, limit = facts_budget(conversation), choice_limit(conversation)
    if checked is not None and holds_choice(checked, limit):
        model = conversation.model or None
        chosen = facts_chosen(checked, model=model, budget=budget, window=limit)
        return block_tokens(chosen, model=model)
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
