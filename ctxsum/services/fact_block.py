"""The facts block of a context: which facts it shows, and keeping its token count in the
conversation's counters whenever facts change.

The block is one user message after the summary (``ctxsum.fact_lines``): a conversation's
own facts and its subject's, pinned first, then the most recently confirmed, as many as
``FACTS_MAX_TOKENS`` allows. Its tokens are part of ``Conversation.active_tokens``, so the
trigger counts it like any message; ``Conversation.facts_tokens`` remembers its share.

Lock order: whoever changes facts locks the conversations that show them in primary-key
order (``conversations_lock``) before writing, so two writers never wait on each other in
a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import Q, QuerySet

from ctxsum import tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.fact_lines import FACTS_HEADER, fact_line
from ctxsum.models import Conversation, Fact

# What a recount changes on the conversation row.
BLOCK_FIELDS = ("facts_tokens", "active_tokens", "revision", "updated_at")
# The fewest tokens a fact's line can cost ("- k: v" and its newline): how many facts a block
# of FACTS_MAX_TOKENS could ever show.
MIN_LINE_TOKENS = 3


def facts_visible(conversation: Conversation) -> QuerySet[Fact]:
    """The conversation's own facts and, when it names a subject, the subject's."""
    mine = Q(conversation=conversation)
    if conversation.subject:
        mine |= Q(
            owner_id=conversation.owner_id,
            conversation__isnull=True,
            subject=conversation.subject,
        )
    db = conversation._state.db
    return (Fact.objects.using(db) if db else Fact.objects.all()).filter(mine)


def block_order(fact: Fact) -> tuple[bool, float, str]:
    """The order the block considers facts in: pinned first, then the most recently
    confirmed (``Fact.Meta.ordering``)."""
    return (not fact.pinned, -fact.confirmed_at.timestamp(), fact.key)


def candidates_limit() -> int:
    """How many facts, in block order, a block is chosen from: as many as could fit, each
    key twice (the conversation's own and its subject's). A read of the block stays the
    same size however many facts a conversation has gathered."""
    return 2 * (max(ctxsum_settings.FACTS_MAX_TOKENS, 0) // MIN_LINE_TOKENS + 1)


def facts_candidates(conversation: Conversation) -> QuerySet[Fact]:
    """The facts the conversation's block is chosen from (one query): ``facts_visible``
    in block order, the first ``candidates_limit()``."""
    ordered = facts_visible(conversation).order_by("-pinned", "-confirmed_at", "key")
    return ordered[: candidates_limit()]


def facts_chosen(facts: Iterable[Fact], *, model: str | None = None) -> list[Fact]:
    """The facts the block shows, in its order: one per key (the conversation's own before
    the subject's), pinned first, then the most recently confirmed, as long as the block
    stays within FACTS_MAX_TOKENS (a fact that does not fit is left out, a shorter one
    after it may still fit)."""
    limit = ctxsum_settings.FACTS_MAX_TOKENS
    by_key: dict[str, Fact] = {}
    for fact in facts:
        kept = by_key.get(fact.key)
        if kept is None or (kept.conversation_id is None and fact.conversation_id is not None):
            by_key[fact.key] = fact
    ordered = sorted(by_key.values(), key=block_order)
    chosen: list[Fact] = []
    used = _header_tokens(model)
    for fact in ordered:
        if used + fact.token_count <= limit:
            chosen.append(fact)
            used += fact.token_count
    # Line counts are taken one by one; drop from the end while the whole block is over.
    while chosen and block_tokens(chosen, model=model) > limit:
        chosen.pop()
    return chosen


def block_message(facts: Sequence[Fact]) -> dict[str, Any]:
    """The block as it enters the context: a user message, like the summary."""
    lines = [FACTS_HEADER, *(fact_line(fact.key, fact.value) for fact in facts)]
    return {"role": "user", "content": "\n".join(lines)}


def block_tokens(facts: Sequence[Fact], *, model: str | None = None) -> int:
    """Tokens of the block as a context message; 0 when it shows no fact (no block)."""
    if not facts:
        return 0
    return tokens.count_message(block_message(facts), model=model)


def _header_tokens(model: str | None) -> int:
    return tokens.count_message({"role": "user", "content": FACTS_HEADER}, model=model)


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
    model = conversation.model or None
    return block_tokens(facts_chosen(facts_candidates(conversation), model=model), model=model)


def facts_recount(locked: Sequence[Conversation]) -> None:
    """Recount the facts block of each conversation (locked by the caller) and move its
    ``active_tokens`` and ``revision`` by what changed; rows whose block costs the same
    are left alone."""
    for conversation in locked:
        count = facts_count(conversation)
        if count == conversation.facts_tokens:
            continue
        conversation.active_tokens += count - conversation.facts_tokens
        conversation.facts_tokens = count
        conversation.revision += 1
        conversation.save(update_fields=BLOCK_FIELDS)
