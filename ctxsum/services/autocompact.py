"""The compaction that follows an append when ``AUTO_COMPACT`` is on: a task enqueued once
the append commits (``COMPACTION_RUNNER``), or, over the ceiling (``MAX_CONTEXT_TOKENS``, else
the model's: a backstop when no worker runs the tasks) or with the ``sync`` runner, a
compaction in the appending process after the commit; never inside the append's transaction
(docs/architecture.md, "Background compaction").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from enum import Enum
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string
from django.utils.translation import gettext_lazy as _

from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import SummarizerError
from ctxsum.models import CompactionAttempt, Conversation
from ctxsum.policy import Reason, failure_reason
from ctxsum.selectors import conversation_policy, summary_withheld
from ctxsum.services.compaction import (
    CompactionResult,
    aconversation_compact,
    conversation_compact,
)
from ctxsum.services.leases import lease_expires, lease_seconds
from ctxsum.services.rebuild import conversation_rebuild, rebuild_gave_no_gain
from ctxsum.services.transactions import write_db
from ctxsum.threads import database_sync_to_async

logger = logging.getLogger("ctxsum.compaction")

DELETED = _("The conversation was deleted.")
# What a task's deferred check answers when the compaction it follows was not lost.
CHECKED = _("The compaction this check follows was not lost: nothing to do.")
# The provider's own words go to the attempt record and the log, not to the client.
SUMMARIZER_FAILED = _("The summarizer failed; the compaction attempt records why.")
# The runners COMPACTION_RUNNER names by a word; anything else is a dotted path.
RUNNERS = {
    "tasks": "ctxsum.tasks.compaction_enqueue",
    "celery": "ctxsum.celery_tasks.compaction_enqueue",
}
SYNC = "sync"
# Compactions one run makes at most: another follows only when messages appended during
# the summarizer call left the context at its trigger again.
MAX_ROUNDS = 3
# ``defer(conversation_id, database, run_after, since)`` enqueues the compaction task for
# ``run_after``; ``since``: the run is the check of a compaction started then.
Defer = Callable[[str, str, datetime, "str | None"], Any]
# How long a compaction task may wait unrun before the admin points it out (no worker?).
QUEUED_LONG = timedelta(minutes=1)
# Attempts that do not end the compaction a check follows: a turn-away by a live lease (the
# holder may be the one lost) and an interruption (its worker stopped).
UNFINISHED = (Reason.IN_PROGRESS, Reason.INTERRUPTED)


@dataclass(frozen=True, kw_only=True)
class AutoCompaction:
    """What the automatic compaction after an append did, for the append's answer."""

    compacted: bool
    reason: Reason
    summary_version: int | None = None
    over_trigger: bool = False
    detail: str = ""
    # Why the summarizer failed (FailureCause), for a summarizer_error; blank otherwise.
    cause: str = ""

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "reason": str(self.reason)}


class Schedule(Enum):
    """What follows an append (``autocompact_schedule``)."""

    OFF = "off"  # AUTO_COMPACT is off
    BELOW = "below"  # below the trigger and the ceiling: nothing
    QUEUED = "queued"  # a compaction task is enqueued when the append commits
    NOW = "now"  # compacted in this process once the append has committed


def compaction_due(conversation: Conversation) -> bool:
    """Whether the conversation has compaction work to do, from the row's counters alone:
    its context reaches its trigger or exceeds its ceiling (the one decision of it)."""
    policy = conversation_policy(conversation)
    return policy.over(conversation.context_messages, conversation.context_tokens)


def over_ceiling(conversation: Conversation) -> bool:
    """Whether the context, from the row's counters, exceeds its ceiling."""
    return conversation_policy(conversation).exceeds(conversation.context_tokens)


def compaction_queued_at(
    conversation: Conversation, last_attempt: datetime | None
) -> datetime | None:
    """When the newest compaction task of ``conversation`` was queued (its last change), if
    over ``QUEUED_LONG`` ago and none has run since: work is due, no live lease, no attempt
    since (the newest was at ``last_attempt``); else None."""
    since, expires = conversation.updated_at, lease_expires(conversation)
    ran = (last_attempt and last_attempt >= since) or (expires and expires > timezone.now())
    waited = since < timezone.now() - QUEUED_LONG and compaction_due(conversation)
    return since if ctxsum_settings.AUTO_COMPACT and waited and not ran else None


def autocompact_schedule(locked: Conversation) -> Schedule:
    """What follows the append, from the row as it left it; ``QUEUED`` enqueues on commit."""
    if not ctxsum_settings.AUTO_COMPACT:
        return Schedule.OFF
    if not compaction_due(locked):
        return Schedule.BELOW
    if over_ceiling(locked) or ctxsum_settings.COMPACTION_RUNNER == SYNC:
        return Schedule.NOW
    db = locked._state.db or write_db(locked)
    transaction.on_commit(partial(_enqueue, str(locked.pk), db), using=db)
    return Schedule.QUEUED


def compaction_enqueuer() -> Callable[[str, str], Any]:
    """The callable COMPACTION_RUNNER names: ``enqueue(conversation_id, database)``."""
    runner = ctxsum_settings.COMPACTION_RUNNER
    enqueue: Callable[[str, str], Any] = import_string(RUNNERS.get(runner, runner))
    return enqueue


def _enqueue(conversation_id: str, db: str) -> None:
    # After the commit: a failure here must not turn a stored append into an error. The next
    # append that reaches the trigger enqueues again.
    try:
        compaction_enqueuer()(conversation_id, db)
    except Exception:
        logger.exception("Could not enqueue the compaction of conversation %s.", conversation_id)


def withheld_rebuild(conversation_id: str, db: str) -> None:
    """After a commit that left the active summary withheld, with AUTO_COMPACT: the
    compaction task rebuilds it, or this process does with the ``sync`` runner. Never
    raises: the summary stays withheld (stale) until a rebuild succeeds."""
    if not ctxsum_settings.AUTO_COMPACT:
        return
    if ctxsum_settings.COMPACTION_RUNNER != SYNC:
        _enqueue(conversation_id, db)
        return
    try:
        conversation_rebuild(conversation=Conversation.objects.using(db).get(pk=conversation_id))
    except Exception:
        logger.exception("Could not rebuild conversation %s's withheld summary.", conversation_id)


def conversation_autocompact(
    *, conversation: Conversation, schedule: Schedule
) -> AutoCompaction | None:
    """After an append has committed: what ``schedule`` said, carried out (``NOW`` inside a
    caller's transaction waits for its commit). Never raises; None when AUTO_COMPACT is off."""
    if schedule is not Schedule.NOW:
        return _not_now(schedule)
    db = write_db(conversation)
    if transaction.get_connection(using=db).in_atomic_block:
        transaction.on_commit(partial(_autocompact, conversation), using=db)
        return AutoCompaction(compacted=False, reason=Reason.DEFERRED)
    return _autocompact(conversation)


async def aconversation_autocompact(
    *, conversation: Conversation, schedule: Schedule
) -> AutoCompaction | None:
    """``conversation_autocompact`` for async code (``amessage_append``): a ``NOW``
    compaction through ``aconversation_compact``. Async code holds no transaction."""
    if schedule is not Schedule.NOW:
        return _not_now(schedule)
    return await _aautocompact(conversation)


def _not_now(schedule: Schedule) -> AutoCompaction | None:
    """What a schedule but ``NOW`` answers: nothing to run in this process."""
    if schedule is Schedule.OFF:
        return None
    if schedule is Schedule.BELOW:
        return AutoCompaction(compacted=False, reason=Reason.BELOW_TRIGGER)
    return AutoCompaction(compacted=False, reason=Reason.QUEUED)


def conversation_compact_queued(
    *, conversation_id: str, database: str, since: str | None = None, defer: Defer | None = None
) -> AutoCompaction:
    """What a compaction task runs: compact the conversation if it has work due. Given
    ``defer``, run again once a live lease expires, and check one lease time after starting
    (``since``) that this compaction was not lost with its worker (``_check_done``). A
    failed summarizer call is recorded and raised, not retried."""
    try:
        conversation = Conversation.objects.using(database).get(pk=conversation_id)
        if not compaction_due(conversation) and not summary_withheld(conversation=conversation):
            return AutoCompaction(compacted=False, reason=Reason.BELOW_TRIGGER)
        checked = _check_done(conversation, since, db=database) if since else None
        if checked is not None:
            return checked
        expires = lease_expires(conversation)
        if expires is not None and expires > timezone.now():
            _defer(defer, conversation_id, database, expires, since)
            return AutoCompaction(compacted=False, reason=Reason.IN_PROGRESS)
        started = timezone.now()
        check_at = started + timedelta(seconds=lease_seconds())
        _defer(defer, conversation_id, database, check_at, started.isoformat())
        return _compact_rounds(conversation)
    except Conversation.DoesNotExist:  # deleted before or during the compaction
        return AutoCompaction(compacted=False, reason=Reason.CONFLICT, detail=str(DELETED))


def _check_done(conversation: Conversation, since: str, *, db: str) -> AutoCompaction | None:
    """What a check answers when the compaction that started at ``since`` was not lost: the
    reason of the newest attempt that ended it, else ``below_trigger``. None when it was
    lost (it left its lease behind, or recorded an interruption): the check compacts."""
    attempts = CompactionAttempt.objects.using(db).filter(
        conversation=conversation, created_at__gte=datetime.fromisoformat(since)
    )
    ended = attempts.exclude(reason__in=UNFINISHED).order_by("-id").values_list("reason").first()
    if ended is not None:
        return AutoCompaction(compacted=False, reason=Reason(ended[0]), detail=str(CHECKED))
    if conversation.lease_owner or attempts.filter(reason=Reason.INTERRUPTED).exists():
        return None
    return AutoCompaction(compacted=False, reason=Reason.BELOW_TRIGGER, detail=str(CHECKED))


def _defer(
    defer: Defer | None, conversation_id: str, database: str, run_after: datetime, since: str | None
) -> None:
    """Have the task run again at ``run_after``; a failure is logged, not raised."""
    if defer is None:
        return
    try:
        defer(conversation_id, database, run_after, since)
    except Exception:
        logger.exception("Could not defer the compaction of conversation %s.", conversation_id)


def _compact_rounds(conversation: Conversation) -> AutoCompaction:
    """Compact; again (MAX_ROUNDS in all) while messages appended during the call left the
    context at its trigger; then rebuild a summary still withheld after a redaction."""
    result: CompactionResult | None = None
    for _round in range(MAX_ROUNDS):
        newest = conversation.next_seq
        result = conversation_compact(conversation=conversation)
        if not _again(conversation, result, newest):
            break
    assert result is not None
    return _rounds_done(conversation, result)


async def _acompact_rounds(conversation: Conversation) -> AutoCompaction:
    """``_compact_rounds`` with ``aconversation_compact``."""
    result: CompactionResult | None = None
    for _round in range(MAX_ROUNDS):
        newest = conversation.next_seq
        result = await aconversation_compact(conversation=conversation)
        if not _again(conversation, result, newest):
            break
    assert result is not None
    return await database_sync_to_async(_rounds_done)(conversation, result)


def _again(conversation: Conversation, result: CompactionResult, newest: int) -> bool:
    """Whether another round follows: messages appended during the call (after ``newest``)
    left the compacted context at its trigger."""
    return result.compacted and result.over_trigger and conversation.next_seq > newest


def _rounds_done(conversation: Conversation, result: CompactionResult) -> AutoCompaction:
    """What the rounds did, their last ``result``; a summary still withheld after a
    redaction is rebuilt first."""
    withheld = not result.compacted and summary_withheld(conversation=conversation)
    if withheld and not rebuild_gave_no_gain(conversation, db=write_db(conversation)):
        rebuilt = conversation_rebuild(conversation=conversation)
        version = rebuilt.summary.version if rebuilt.summary else None
        return AutoCompaction(
            compacted=rebuilt.rebuilt, reason=rebuilt.reason, summary_version=version
        )
    return AutoCompaction(
        compacted=result.compacted,
        reason=result.reason,
        summary_version=result.summary.version if result.summary else None,
        over_trigger=result.over_trigger,
    )


def _autocompact(conversation: Conversation) -> AutoCompaction:
    try:
        return _compact_rounds(conversation)
    except Exception as error:
        return _auto_failed(conversation, error)


async def _aautocompact(conversation: Conversation) -> AutoCompaction:
    try:
        return await _acompact_rounds(conversation)
    except Exception as error:
        return _auto_failed(conversation, error)


def _auto_failed(conversation: Conversation, error: Exception) -> AutoCompaction:
    """What an automatic compaction that raised ``error`` answers: it never raises."""
    if isinstance(error, SummarizerError):
        reason, cause = failure_reason(error), str(error.kind)
        return AutoCompaction(
            compacted=False, reason=reason, detail=str(SUMMARIZER_FAILED), cause=cause
        )
    if isinstance(error, Conversation.DoesNotExist):
        return AutoCompaction(compacted=False, reason=Reason.CONFLICT, detail=str(DELETED))
    logger.exception("Automatic compaction of conversation %s failed.", conversation.pk)
    return AutoCompaction(compacted=False, reason=Reason.ERROR, detail=type(error).__name__)
