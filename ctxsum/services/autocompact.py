"""The compaction that follows an append when ``AUTO_COMPACT`` is on.

Under the append's row lock, ``autocompact_schedule`` decides from the conversation's
counters what follows: nothing (below the trigger), a compaction task enqueued once the
append commits (``COMPACTION_RUNNER``: Django's tasks framework, Celery, or a callable of
the project's), or, for a context over ``MAX_CONTEXT_TOKENS`` (or with the ``sync`` runner),
a compaction in the appending process right after the commit. Never inside the append's
transaction: the summarizer call must not run while its row lock is held, and its failure
must never undo the append. docs/architecture.md, "Background compaction".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum
from functools import partial
from typing import Any

from django.db import transaction
from django.utils.module_loading import import_string
from django.utils.translation import gettext_lazy as _

from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import SummarizerError
from ctxsum.models import Conversation
from ctxsum.policy import Reason
from ctxsum.selectors import conversation_policy
from ctxsum.services.compaction import CompactionResult, conversation_compact, failure_reason
from ctxsum.services.leases import lease_held
from ctxsum.services.transactions import write_db

logger = logging.getLogger("ctxsum.compaction")

DELETED = _("The conversation was deleted.")
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


@dataclass(frozen=True, kw_only=True)
class AutoCompaction:
    """What the automatic compaction after an append did, for the append's answer."""

    compacted: bool
    reason: Reason
    summary_version: int | None = None
    over_trigger: bool = False
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "reason": str(self.reason)}


class Schedule(Enum):
    """What follows an append (``autocompact_schedule``)."""

    OFF = "off"  # AUTO_COMPACT is off
    BELOW = "below"  # below the trigger and the ceiling: nothing
    QUEUED = "queued"  # a compaction task is enqueued when the append commits
    NOW = "now"  # compacted in this process once the append has committed


def compaction_due(conversation: Conversation) -> tuple[bool, bool]:
    """From the row's counters alone: whether the context reaches its trigger or exceeds its
    ceiling, and whether it exceeds the ceiling. The message count takes a summary in the
    context whenever a message left it (archived, or a replaced system prompt): at worst a
    task that finds the trigger not reached; and the facts block, when there is one. The
    tokens count both (``active_tokens``)."""
    policy = conversation_policy(conversation)
    count = conversation.active_message_count
    count += conversation.message_count > conversation.active_message_count
    count += conversation.facts_tokens > 0
    tokens = conversation.context_tokens
    ceiling = policy.max_context_tokens
    over_ceiling = ceiling is not None and tokens > ceiling
    return policy.over(count, tokens), over_ceiling


def autocompact_schedule(locked: Conversation) -> Schedule:
    """From the row as the append left it (in the append's transaction, or right after its
    one statement on PostgreSQL): what follows the append. For ``QUEUED`` the enqueue is
    registered with ``on_commit``, so a rolled-back append (or a caller's transaction that
    rolls back) enqueues nothing."""
    if not ctxsum_settings.AUTO_COMPACT:
        return Schedule.OFF
    due, over_ceiling = compaction_due(locked)
    if not due:
        return Schedule.BELOW
    if over_ceiling or ctxsum_settings.COMPACTION_RUNNER == SYNC:
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


def conversation_autocompact(
    *, conversation: Conversation, schedule: Schedule
) -> AutoCompaction | None:
    """After an append has committed: what ``schedule`` said, carried out. Never raises (the
    append stands whatever happens here); None when AUTO_COMPACT is off.

    ``NOW`` inside a caller's transaction waits for it to commit (reason ``deferred``).
    """
    if schedule is Schedule.OFF:
        return None
    if schedule is Schedule.BELOW:
        return AutoCompaction(compacted=False, reason=Reason.BELOW_TRIGGER)
    if schedule is Schedule.QUEUED:
        return AutoCompaction(compacted=False, reason=Reason.QUEUED)
    db = write_db(conversation)
    if transaction.get_connection(using=db).in_atomic_block:
        transaction.on_commit(partial(_autocompact, conversation), using=db)
        return AutoCompaction(compacted=False, reason=Reason.DEFERRED)
    return _autocompact(conversation)


def conversation_compact_queued(*, conversation_id: str, database: str) -> AutoCompaction:
    """What a compaction task runs: compact the conversation if it still reaches its trigger.

    Cheap when there is nothing to do: one read of the row answers ``below_trigger`` (an
    earlier task compacted already) or ``in_progress`` (another worker holds the lease; the
    duplicate collapses into it, and no attempt is recorded). Otherwise
    ``conversation_compact`` runs with its lease and compare-and-commit. A failed summarizer
    call is recorded as a failed attempt and raised, so the task engine marks the task
    failed; it is not retried (the next append that reaches the trigger enqueues again).
    """
    try:
        conversation = Conversation.objects.using(database).get(pk=conversation_id)
    except Conversation.DoesNotExist:
        return AutoCompaction(compacted=False, reason=Reason.CONFLICT, detail=str(DELETED))
    due, _over_ceiling = compaction_due(conversation)
    if not due:
        return AutoCompaction(compacted=False, reason=Reason.BELOW_TRIGGER)
    if lease_held(conversation):
        return AutoCompaction(compacted=False, reason=Reason.IN_PROGRESS)
    try:
        return _compact_rounds(conversation)
    except Conversation.DoesNotExist:
        return AutoCompaction(compacted=False, reason=Reason.CONFLICT, detail=str(DELETED))


def _compact_rounds(conversation: Conversation) -> AutoCompaction:
    """Compact; again (at most MAX_ROUNDS in all) while messages appended during the
    summarizer call left the context at its trigger. Raises what conversation_compact
    raises."""
    result: CompactionResult | None = None
    for _round in range(MAX_ROUNDS):
        newest = conversation.next_seq
        result = conversation_compact(conversation=conversation)
        if not (result.compacted and result.over_trigger and conversation.next_seq > newest):
            break
    assert result is not None
    return AutoCompaction(
        compacted=result.compacted,
        reason=result.reason,
        summary_version=result.summary.version if result.summary else None,
        over_trigger=result.over_trigger,
    )


def _autocompact(conversation: Conversation) -> AutoCompaction:
    try:
        return _compact_rounds(conversation)
    except SummarizerError as error:
        reason = failure_reason(error)
        return AutoCompaction(compacted=False, reason=reason, detail=str(SUMMARIZER_FAILED))
    except Conversation.DoesNotExist:
        return AutoCompaction(compacted=False, reason=Reason.CONFLICT, detail=str(DELETED))
    except Exception as error:
        logger.exception("Automatic compaction of conversation %s failed.", conversation.pk)
        return AutoCompaction(compacted=False, reason=Reason.ERROR, detail=type(error).__name__)
