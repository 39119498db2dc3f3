"""The key facts a summary version proposed, merged by key into the stored facts inside the
commit that wrote the version; undone with the version; taken back when a message they came
from is redacted (docs/architecture.md, "Key facts"; lock order: ``ctxsum.facts.block``).

A conversation that names a subject writes the subject's facts, unless it has its own under
that key. A new key is created; the same value again is confirmed; a new value replaces the
old one, unless the fact is pinned or a person wrote it: then it is only proposed. Every
write records a ``FactChange`` with the fact as it was, which a revert restores. Facts never
cost a summary: what the merge cannot store is skipped, said in ``Summary.facts_skipped``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.db import DataError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from ctxsum.facts.block import (
    block_order,
    block_tokens,
    choice_limit,
    conversations_lock,
    facts_budget,
    facts_chosen,
    facts_recount,
    facts_visible,
    line_tokens,
    one_per_key,
)
from ctxsum.facts.candidates import Candidate, Line, candidates
from ctxsum.facts.lines import carries
from ctxsum.facts.models import Fact, FactChange
from ctxsum.models import Conversation, Summary
from ctxsum.summarizers import facts as fact_parse
from ctxsum.summarizers.facts import ProposedFact, one_line

logger = logging.getLogger("ctxsum.compaction")

SUBJECT_CHANGED = (
    "The conversation's subject changed while the summary was written; its key facts were "
    "not merged."
)
NOT_STORED = "The key facts could not be stored ({error}); the summary was."
CROWDED = (
    "{count} facts were left out: the facts block would have grown by more than the new "
    "summary saves."
)

Kind = FactChange.Kind
MODEL, PERSON = Fact.ChangedBy.MODEL, Fact.ChangedBy.PERSON


def facts_lock(conversation: Conversation, *, db: str) -> list[Conversation]:
    """The first lock of a commit that changes facts, before its own row lock: every
    conversation of the owner naming ``conversation``'s subject (none without one: its own
    row lock covers its own facts)."""
    if not conversation.subject:
        return []
    return conversations_lock(
        db=db,
        owner_id=conversation.owner_id,
        subject=conversation.subject,
        conversation_id=conversation.pk,
    )


@dataclass(frozen=True, kw_only=True)
class Merged:
    """What a merge did: ``crowded``, how many facts were left out for room; ``shared``,
    whether it changed a subject's fact that the subject's other conversations may show."""

    crowded: int
    shared: bool


def facts_commit(
    *,
    locked: Conversation,
    shown: Sequence[Conversation],
    subject: str,
    summary: Summary,
    facts: Sequence[ProposedFact],
    room: int | None = None,
    text: str = "",
) -> None:
    """Merge the ``facts`` version ``summary`` proposed, then bring the facts blocks of the
    other conversations of ``shown`` up to date (``locked``'s own follows its context's
    check, ``hooks``). ``subject``: the one whose conversations ``shown`` holds (another one
    by now: the facts are skipped). ``room``: the most tokens ``locked``'s block may grow
    by, in its context as the commit leaves it (``text``, its ``context_text``)."""
    if not facts:
        return
    if locked.subject != subject:
        _skipped(summary, [SUBJECT_CHANGED])
        return
    try:
        # A savepoint: a merge that fails on its data leaves the summary's commit intact.
        with transaction.atomic(using=locked._state.db):
            merged = facts_merge(locked=locked, summary=summary, facts=facts, room=room, text=text)
    except (DataError, ValidationError, ValueError) as error:
        logger.warning("Key facts of conversation %s not stored: %s", locked.pk, error)
        _skipped(summary, [NOT_STORED.format(error=error)])
        return
    if merged.crowded:
        _skipped(summary, [CROWDED.format(count=merged.crowded)])
    _recount(locked, shown, shared=merged.shared)


def facts_merge(
    *,
    locked: Conversation,
    summary: Summary,
    facts: Sequence[ProposedFact],
    room: int | None = None,
    text: str = "",
) -> Merged:
    """Merge ``facts`` by key into the facts ``locked`` shows, recording a ``FactChange``
    for every write; with ``room``, a fact that would grow the block past it, in the
    context ``text`` (its ``context_text``), is left out."""
    db = locked._state.db or "default"
    now = timezone.now()
    model, budget = locked.model or None, facts_budget(locked)
    # The facts under the keys proposed, and those the block is chosen from (2 queries).
    targets = one_per_key(facts_visible(locked).filter(key__in=[fact.key for fact in facts]))
    window = choice_limit(locked)
    first = candidates(facts_visible(locked)[: 2 * window])

    def mark(fact: Fact | Candidate) -> Line:
        hidden = not fact.pinned and carries(text, fact.value)
        if isinstance(fact, Candidate):
            return fact._replace(hidden=hidden)
        fact.hidden = hidden  # type: ignore[attr-defined]
        return fact

    # The facts as the merge leaves them, by row (new ones by key): what the block will show.
    state: dict[object, Line] = {fact.pk: mark(fact) for fact in first}

    def block(rows: dict[object, Line]) -> int:
        ordered = sorted(rows.values(), key=block_order)
        chosen = facts_chosen(ordered, model=model, budget=budget, window=window)
        return block_tokens(chosen, model=model)

    # Against the block the compaction saw, counted in its context.
    limit = None if room is None else locked.facts_tokens + room
    writes: list[tuple[Fact | None, Fact, str]] = []
    crowded = 0
    for proposed in facts:
        target = targets.get(proposed.key)
        merged, kind = _merged(target, proposed, locked=locked, summary=summary, now=now)
        slot: object = target.pk if target is not None else ("new", proposed.key)
        after = {**state, slot: mark(merged)}
        if limit is not None and block(after) > limit:
            crowded += 1
            continue
        state = after
        writes.append((target, merged, kind))
    _write(db, writes, summary, now)
    return Merged(
        crowded=crowded,
        shared=any(
            merged.conversation_id is None and kind != Kind.PROPOSED for _, merged, kind in writes
        ),
    )


# What a merge changes on a fact it does not create.
MERGED_FIELDS = (
    "value",
    "source_seqs",
    "source_conversation",
    "summary",
    "confirmed_at",
    "token_count",
    "proposed_value",
    "proposed_by",
    "updated_at",
)


def _write(
    db: str, writes: Sequence[tuple[Fact | None, Fact, str]], summary: Summary, now: Any
) -> None:
    """The merge's writes in four statements at most: new facts, changed ones (two), changes."""
    created = [merged for target, merged, _ in writes if target is None]
    changed = [(target, merged) for target, merged, _ in writes if target is not None]
    # Sets the new facts' ids: every database ctxsum runs on returns them (its appends
    # need RETURNING too).
    Fact.objects.using(db).bulk_create(created)
    for _, fact in changed:
        fact.updated_at = now
    _update(Fact.objects.using(db), changed, MERGED_FIELDS)
    changes = []
    for target, merged, kind in writes:
        change = _before(target) if target is not None else FactChange()
        change.fact, change.summary, change.kind = merged, summary, kind
        changes.append(change)
    FactChange.objects.using(db).bulk_create(changes)


def _update(
    facts: QuerySet[Fact], changed: Sequence[tuple[Fact, Fact]], fields: Sequence[str]
) -> None:
    """Save the ``fields`` that ``changed`` (pairs of a fact as read and as merged) changed,
    in two statements at most: one setting the values every row shares, one
    ``bulk_update`` of the others (a merge's confirmations differ in ``source_seqs`` only)."""
    if not changed:
        return
    rows = [merged for _, merged in changed]
    attnames = {field.name: field.attname for field in Fact._meta.concrete_fields}
    attnames = {name: attnames[name] for name in fields}
    columns = {
        name: column
        for name, column in attnames.items()
        if any(getattr(read, column) != getattr(merged, column) for read, merged in changed)
    }
    shared = {
        column: getattr(rows[0], column)
        for column in columns.values()
        if all(getattr(row, column) == getattr(rows[0], column) for row in rows)
    }
    varying = [name for name, column in columns.items() if column not in shared]
    if varying:
        facts.bulk_update(rows, fields=varying)
    if shared:
        facts.filter(pk__in=[row.pk for row in rows]).update(**shared)


def _merged(
    fact: Fact | None, proposed: ProposedFact, *, locked: Conversation, summary: Summary, now: Any
) -> tuple[Fact, str]:
    """A new instance of ``fact`` (None: none yet) with ``proposed`` merged, and the kind."""
    if fact is None:
        merged = Fact(
            owner_id=locked.owner_id,
            conversation=None if locked.subject else locked,
            subject=locked.subject,
            key=proposed.key,
            changed_by=MODEL,
        )
    else:
        merged = copy.copy(fact)
    same = fact is not None and one_line(fact.value) == proposed.value
    if not same and (merged.pinned or merged.changed_by == PERSON):
        merged.proposed_value, merged.proposed_by = proposed.value, summary
        return merged, Kind.PROPOSED
    if same:
        same_source = merged.source_conversation_id == locked.pk
        seqs = {*merged.source_seqs, *proposed.source_seqs} if same_source else set()
        merged.source_seqs = sorted(seqs or proposed.source_seqs)
    else:
        merged.value = proposed.value
        merged.source_seqs = list(proposed.source_seqs)
        merged.summary = summary
        merged.token_count = line_tokens(merged, model=locked.model or None)
    merged.source_conversation = locked
    merged.confirmed_at = now
    # The model's value stands now: an earlier proposal is withdrawn.
    merged.proposed_value, merged.proposed_by = "", None
    if fact is None:
        return merged, Kind.CREATED
    return merged, Kind.CONFIRMED if same else Kind.UPDATED


def _before(fact: Fact) -> FactChange:
    """A change of ``fact``, holding the fact as it is before it."""
    return FactChange(
        old_value=fact.value,
        old_source_seqs=list(fact.source_seqs),
        old_source_conversation_id=fact.source_conversation_id,
        old_summary_id=fact.summary_id,
        old_confirmed_at=fact.confirmed_at,
        old_proposed_value=fact.proposed_value,
        old_proposed_by_id=fact.proposed_by_id,
    )


def facts_to_revert(target: Summary) -> bool:
    """Whether version ``target`` wrote facts, which a revert of it undoes."""
    return FactChange.objects.using(target._state.db).filter(summary=target).exists()


def facts_revert(
    *, locked: Conversation, shown: Sequence[Conversation], subject: str, target: Summary
) -> None:
    """Undo what version ``target`` wrote to facts, newest change first (``_undo``), then
    recount the blocks as after a merge. The facts of a subject other than ``subject``, whose
    conversations ``facts_lock`` locked, are left as they are."""
    db = locked._state.db or "default"
    changes = list(
        FactChange.objects.using(db).filter(summary=target).select_related("fact").order_by("-id")
    )
    if not changes:
        return
    shared = False
    for change in changes:
        if not _held(change.fact, locked, subject):
            continue  # a fact of another subject by now: its conversations are not locked
        shared |= _undo(change, target=target, locked=locked, db=db)
    _recount(locked, shown, shared=shared)


def _undo(change: FactChange, *, target: Summary, locked: Conversation, db: str) -> bool:
    """Undo one ``change`` of version ``target`` (a created fact deleted, a changed one as it
    was, a proposal withdrawn), unless the fact moved on since (a person's edit or pin,
    another version's change or confirmation); whether a subject's fact changed."""
    fact = change.fact
    if change.kind == Kind.PROPOSED:
        if fact.proposed_by_id == target.pk:
            fact.proposed_value = change.old_proposed_value
            fact.proposed_by_id = change.old_proposed_by_id
            fact.save(using=db, update_fields=["proposed_value", "proposed_by", "updated_at"])
        return False
    if fact.pinned or fact.changed_by == PERSON:
        return False  # a person's since: theirs to keep
    # What the version wrote stands as it left it: not changed by another version, nor
    # confirmed by another conversation of the subject since.
    untouched = fact.summary_id == target.pk and fact.source_conversation_id == locked.pk
    # Created by the version, or updated from a value redacted since (facts_forget blanked
    # it): there is no value to go back to.
    if change.kind == Kind.CREATED or (change.kind == Kind.UPDATED and not change.old_value):
        if untouched:
            fact.delete()
        return untouched and fact.conversation_id is None
    if change.kind == Kind.UPDATED:
        if not untouched:
            return False
        fact.value = change.old_value
        fact.summary_id = change.old_summary_id
        fact.token_count = line_tokens(fact, model=locked.model or None)
    elif (
        fact.summary_id != change.old_summary_id
        or fact.value != change.old_value
        or fact.source_conversation_id != locked.pk
    ):
        return False  # its value changed, or another conversation confirmed it, since
    fact.source_seqs = list(change.old_source_seqs)
    fact.source_conversation_id = change.old_source_conversation_id
    fact.confirmed_at = change.old_confirmed_at or fact.confirmed_at
    fact.proposed_value = change.old_proposed_value
    fact.proposed_by_id = change.old_proposed_by_id
    fact.save(using=db)
    return fact.conversation_id is None


class _Citing(NamedTuple):
    """What of the facts holds words of one message (``seq`` of a conversation)."""

    # The model's facts taken from it (not pinned): deleted.
    facts: list[Fact]
    # Changes whose fact, as it was before, came from it: their old value is blanked.
    changes: list[int]
    # Facts with a proposal of a version that covers it, and changes holding such a
    # proposal as it was: withdrawn, blanked. Where a proposal came from is not recorded.
    proposals: list[int]
    old_proposals: list[int]


def _citing(conversation: Conversation, seq: int, *, db: str) -> _Citing:
    facts = Fact.objects.using(db)
    changes = FactChange.objects.using(db)
    covering = Summary.objects.using(db).filter(
        conversation=conversation, from_seq__lte=seq, to_seq__gte=seq
    )
    model_facts = facts.filter(source_conversation=conversation, changed_by=MODEL, pinned=False)
    earlier = changes.filter(old_source_conversation=conversation).exclude(old_value="")
    return _Citing(
        facts=[fact for fact in model_facts if seq in (fact.source_seqs or ())],
        changes=[
            pk for pk, seqs in earlier.values_list("pk", "old_source_seqs") if seq in (seqs or ())
        ],
        proposals=list(facts.filter(proposed_by__in=covering).values_list("pk", flat=True)),
        old_proposals=list(
            changes.filter(old_proposed_by__in=covering)
            .exclude(old_proposed_value="")
            .values_list("pk", flat=True)
        ),
    )


def facts_cite(conversation: Conversation, seq: int, *, db: str) -> bool:
    """Whether anything of the facts holds words of message ``seq`` (its redaction then
    needs ``facts_lock``)."""
    return any(_citing(conversation, seq, db=db))


def facts_forget(
    *, locked: Conversation, shown: Sequence[Conversation], subject: str, seq: int
) -> None:
    """Take back what the facts hold of message ``seq`` of ``locked``, just redacted (see
    ``_Citing``: a person's or a pinned fact stays), then recount the facts blocks. The
    facts of a subject other than ``subject`` (locked by ``facts_lock``) are not deleted."""
    db = locked._state.db or "default"
    citing = _citing(locked, seq, db=db)
    FactChange.objects.using(db).filter(pk__in=citing.changes).update(old_value="")
    FactChange.objects.using(db).filter(pk__in=citing.old_proposals).update(
        old_proposed_value="", old_proposed_by=None
    )
    Fact.objects.using(db).filter(pk__in=citing.proposals).update(
        proposed_value="", proposed_by=None
    )
    cited = [fact for fact in citing.facts if _held(fact, locked, subject)]
    if not cited:
        return
    Fact.objects.using(db).filter(pk__in=[fact.pk for fact in cited]).delete()
    shared = any(fact.conversation_id is None for fact in cited)
    _recount(locked, shown, shared=shared)


def _held(fact: Fact, locked: Conversation, subject: str) -> bool:
    """Whether the locks taken cover ``fact``: ``locked``'s own, or a fact of ``subject``
    (whose conversations ``facts_lock`` locked) that ``locked`` still names."""
    if fact.conversation_id is not None:
        return fact.conversation_id == locked.pk
    return fact.owner_id == locked.owner_id and fact.subject == subject == locked.subject


def _recount(locked: Conversation, shown: Sequence[Conversation], *, shared: bool) -> None:
    """Recount the blocks of the conversations of ``shown`` but ``locked`` (``shared``: a
    subject's fact they may show changed); ``locked``'s follows its context's check."""
    facts_recount(
        [conversation for conversation in shown if conversation.pk != locked.pk], changed=shared
    )


def _skipped(summary: Summary, reasons: Sequence[str]) -> None:
    summary.facts_skipped = fact_parse.skipped_text([*summary.facts_skipped.splitlines(), *reasons])
    Summary.objects.using(summary._state.db).filter(pk=summary.pk).update(
        facts_skipped=summary.facts_skipped
    )
