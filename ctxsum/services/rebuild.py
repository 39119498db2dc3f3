"""Rebuilding a stale summary (another prompt wrote it, or a message it covers was
redacted) with a compaction's lease, no-gain guard and compare-and-commit; the version it
replaces is kept, marked superseded (docs/architecture.md, "Rebuild and redaction").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from django.db import DatabaseError, transaction

from ctxsum.conf import ctxsum_settings
from ctxsum.hooks import SummaryCommitted, commit_apply, commit_lock, concerned
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary, single
from ctxsum.policy import MIN_SUMMARY_BUDGET, Reason, failure_reason, summary_budget
from ctxsum.selectors import conversation_policy
from ctxsum.services.compaction import (
    NoGain,
    active_summary_is,
    attempt_record,
    commit_save,
    failure_log,
    gain_check,
    redactions_unchanged,
    summary_insert,
)
from ctxsum.services.leases import LeaseLost, lease_lock, lease_renew, leased
from ctxsum.services.summaries import Written, summary_coverage, summary_size, summary_write
from ctxsum.services.transactions import write_db

logger = logging.getLogger("ctxsum.compaction")
Outcome = CompactionAttempt.Outcome


@dataclass(frozen=True, kw_only=True)
class Rebuilt:
    """What a rebuild did; ``reason`` says why when nothing was rebuilt."""

    rebuilt: bool
    reason: Reason
    summary: Summary | None = None
    replaced: Summary | None = None


def conversation_rebuild(*, conversation: Conversation) -> Rebuilt:
    """Write the conversation's active summary anew from every archived message, under the
    current prompt (``_budget`` says how long). A summarizer failure changes nothing, is
    recorded and raised, like a compaction's. ``conversation`` is brought up to date."""
    db = write_db(conversation)
    conversation.update_from(Conversation.objects.using(db).get(pk=conversation.pk))
    previous = single(Summary.objects.using(db).filter(conversation=conversation, active=True))
    if previous is None:
        return Rebuilt(rebuilt=False, reason=Reason.NOTHING_TO_SUMMARIZE)
    failed = partial(_failed, conversation, previous, db=db)
    try:
        with leased(conversation, db=db, failed=failed) as token:
            if token is None:
                return Rebuilt(rebuilt=False, reason=Reason.IN_PROGRESS, replaced=previous)
            summary = _rebuild_leased(conversation, previous, token, db=db)
    except LeaseLost:
        return Rebuilt(rebuilt=False, reason=Reason.CONFLICT, replaced=previous)
    except NoGain:
        # ``summary``: the version it could not rebuild with a gain (rebuild_gave_no_gain).
        outcome, reason = Outcome.SKIPPED, Reason.NO_GAIN
        _record(conversation, previous, db=db, outcome=outcome, reason=reason, summary=previous)
        return Rebuilt(rebuilt=False, reason=Reason.NO_GAIN, replaced=previous)
    try:
        conversation.update_from(Conversation.objects.using(db).get(pk=conversation.pk))
    except DatabaseError:  # the rebuild stands: whoever asked is told it rebuilt
        logger.exception("Conversation %s rebuilt; its row could not be read.", conversation.pk)
    return Rebuilt(rebuilt=True, reason=Reason.REBUILT, summary=summary, replaced=previous)


def _rebuild_leased(
    conversation: Conversation, previous: Summary, token: str, *, db: str
) -> Summary:
    rows = Message.objects.using(db).filter(conversation=conversation).archived()
    archived = list(rows.order_by("seq"))
    stands_for = sum(row.token_count for row in archived)
    written = summary_write(
        conversation,
        None,
        archived,
        budget=_budget(conversation, previous, stands_for),
        before_call=partial(lease_renew, conversation, token, db=db),
    )
    gain_check(written, replaced_tokens=stands_for)
    return _commit(conversation, previous, written, token, archived=archived, db=db)


def _budget(conversation: Conversation, previous: Summary, stands_for: int) -> int:
    """The rebuilt summary's length budget: no longer than the summary it replaces; for a
    withheld one (a short notice now), what a compaction's may take, within the ceiling."""
    budget = summary_budget(
        previous_tokens=0,
        archived_tokens=stands_for,
        max_tokens=ctxsum_settings.SUMMARY_MAX_TOKENS,
        goal_tokens=None,
    )
    framing = summary_size("", conversation)
    room = previous.token_count - framing
    if previous.covers_redacted:
        ceiling = conversation_policy(conversation).max_context_tokens
        others = conversation.context_tokens - previous.token_count
        room = budget if ceiling is None else ceiling - others - framing
    return min(budget, max(room, MIN_SUMMARY_BUDGET))


def _commit(
    conversation: Conversation,
    previous: Summary,
    written: Written,
    token: str,
    *,
    archived: list[Message],
    db: str,
) -> Summary:
    checked = summary_coverage(None, archived, written.text)
    event = SummaryCommitted(facts=written.facts)
    hooks = concerned(conversation, event, db=db)
    with transaction.atomic(using=db):
        held = commit_lock(conversation, hooks, event, db=db)  # before the row's lock
        locked = lease_lock(conversation, token, db=db)
        # A compaction or a redaction (invariant f) since: this rebuild is out of date.
        if not active_summary_is(locked, previous) or not redactions_unchanged(locked, archived):
            raise LeaseLost
        summary = summary_insert(
            locked,
            previous,
            written,
            checked,
            from_seq=previous.from_seq,
            to_seq=previous.to_seq,
            origin=Summary.Origin.REBUILD,
        )
        before = locked.context_tokens
        # The context must not grow: the blocks may take what the summary gave back.
        room = max(previous.token_count - summary.token_count, 0)
        commit_apply(held, replace(event, summary=summary, room=room), locked=locked)
        locked.active_tokens += summary.token_count - previous.token_count
        commit_save(
            locked,
            outcome=Outcome.COMPACTED,
            reason=Reason.REBUILT,
            summary=summary,
            tokens_before=before,
            from_seq=summary.from_seq,
            to_seq=summary.to_seq,
        )
    return summary


def _record(conversation: Conversation, previous: Summary, *, db: str, **fields: Any) -> None:
    """An attempt on the range of ``previous`` that changed nothing."""
    attempt_record(
        conversation, db=db, from_seq=previous.from_seq, to_seq=previous.to_seq, **fields
    )


def rebuild_gave_no_gain(conversation: Conversation, *, db: str) -> bool:
    """Whether a rebuild of the active summary already gave no gain: the automatic rebuild
    of a withheld summary does not call the summarizer for it again (a person still can)."""
    attempts = CompactionAttempt.objects.using(db).filter(
        conversation=conversation, reason=Reason.NO_GAIN, summary__active=True
    )
    return attempts.exists()


def _failed(
    conversation: Conversation, previous: Summary, error: BaseException, *, db: str
) -> None:
    failure_log(error)("Rebuild of conversation %s's summary failed: %s", conversation.pk, error)
    detail = f"{type(error).__name__}: {error}"
    outcome, reason = Outcome.FAILED, failure_reason(error)
    _record(conversation, previous, db=db, outcome=outcome, reason=reason, error=detail)
