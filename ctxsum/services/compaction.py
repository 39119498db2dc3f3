"""Compaction: replace the oldest messages of the active context with an LLM summary.

Snapshot, lease, summarize outside every transaction, then lock the row filtered on the
lease and commit only if the snapshot still holds (docs/architecture.md): losing a race
wastes a summary, never a message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Max, Q

from ctxsum import signals
from ctxsum.conf import ctxsum_settings
from ctxsum.coverage import Coverage
from ctxsum.exceptions import SummarizerError
from ctxsum.hooks import SummaryCommitted, commit_apply, commit_lock, concerned
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary, single
from ctxsum.policy import Incoming, Plan, Policy, Reason, Sizing, failure_reason, plan_compaction
from ctxsum.selectors import ActiveContext, context_get, conversation_policy, current_prompt
from ctxsum.services.leases import (
    LeaseLost,
    WriteNothing,
    aleased,
    lease_lock,
    lease_renew,
    leased,
)
from ctxsum.services.summaries import (
    Written,
    asummary_write,
    payoff_sizing,
    summary_coverage,
    summary_size,
    summary_write,
)
from ctxsum.services.transactions import after_commit, write_db
from ctxsum.threads import database_sync_to_async

logger = logging.getLogger("ctxsum.compaction")

# Reasons recorded as skipped attempts; below_trigger is the normal case and is not recorded.
RECORDED_SKIPS = (
    Reason.NOTHING_TO_SUMMARIZE,
    Reason.IN_PROGRESS,
    Reason.NO_GAIN,
    Reason.NO_PAYOFF,
)
Outcome = CompactionAttempt.Outcome


class _Conflict(WriteNothing):
    """The snapshot no longer matches the database: roll back, write nothing."""


class NoGain(WriteNothing):
    """The summary is not smaller than what it would replace: write nothing."""


@dataclass(kw_only=True)
class CompactionResult:
    """What a compaction did; ``reason`` says why when nothing was compacted.
    ``over_trigger``: the context (as left, or as a dry run would leave it) is still over."""

    compacted: bool
    reason: Reason
    # None only when the context could not be read after the compaction committed.
    context: ActiveContext | None
    plan: Plan | None = None
    summary: Summary | None = None
    attempt: CompactionAttempt | None = None
    archived: list[Message] = field(default_factory=list)  # archived, or would be on a dry run
    over_trigger: bool = False


@dataclass(frozen=True, kw_only=True)
class _Run:
    """One compaction of one snapshot: what every step after the plan needs."""

    context: ActiveContext
    plan: Plan
    policy: Policy
    archived: list[Message]
    force: bool
    db: str
    # Messages that join the context right after the compaction (count, tokens).
    incoming: Incoming = (0, 0)
    # What the summarizer reads (``summary_source``).
    so_far: Summary | None = None
    source: list[Message] = field(default_factory=list)

    @property
    def conversation(self) -> Conversation:
        return self.context.conversation

    def over(self, context: ActiveContext) -> bool:
        """Whether ``context``, with the incoming messages, still reaches the trigger or
        exceeds the ceiling."""
        return context_over(self.policy, context, self.incoming)


def context_over(policy: Policy, context: ActiveContext, incoming: Incoming) -> bool:
    """Whether ``context``, with the ``incoming`` messages, reaches the trigger or exceeds
    the ceiling of ``policy``."""
    count, tokens = incoming
    return policy.over(len(context.messages) + count, context.token_count + tokens)


def conversation_compact(
    *,
    conversation: Conversation,
    force: bool = False,
    dry_run: bool = False,
    incoming: Incoming = (0, 0),
) -> CompactionResult:
    """Compact the conversation if its trigger is reached (or ``force``); ``dry_run`` plans
    only; the trigger and ``over_trigger`` count ``incoming`` (``plan_compaction``). Raises
    SummarizerError when the summarizer fails (recorded, nothing changed, no retry),
    Conversation.DoesNotExist when the conversation is deleted meanwhile.
    ``conversation`` is brought up to date."""
    run = _planned(conversation, force=force, dry_run=dry_run, incoming=incoming)
    if isinstance(run, CompactionResult):
        return run
    try:
        with leased(run.conversation, db=run.db, failed=partial(_failed, run)) as token:
            if token is None:
                return _skipped(run, Reason.IN_PROGRESS, archived=[])
            # Outside every transaction: the LLM call may take seconds and holds no lock.
            written = summary_write(
                run.conversation,
                run.so_far,
                run.source,
                budget=run.plan.summary_budget,
                before_call=partial(lease_renew, run.conversation, token, db=run.db),
            )
            summary, attempt = _written_commit(run, written, token)
    except (WriteNothing, LeaseLost) as nothing:
        return _not_written(run, nothing)
    return _compacted(run, summary, attempt)


async def aconversation_compact(
    *,
    conversation: Conversation,
    force: bool = False,
    dry_run: bool = False,
    incoming: Incoming = (0, 0),
) -> CompactionResult:
    """``conversation_compact`` for async code: the same snapshot, plan, lease and commit,
    each run in the thread that serves the database, and the summarizer's ``aanswer()``
    awaited between them with no connection in use."""
    run = await database_sync_to_async(_planned)(
        conversation, force=force, dry_run=dry_run, incoming=incoming
    )
    if isinstance(run, CompactionResult):
        return run
    try:
        async with aleased(run.conversation, db=run.db, failed=partial(_failed, run)) as token:
            if token is None:
                return await database_sync_to_async(_skipped)(run, Reason.IN_PROGRESS, archived=[])
            renew = database_sync_to_async(partial(lease_renew, run.conversation, token, db=run.db))
            written = await asummary_write(
                run.conversation,
                run.so_far,
                run.source,
                budget=run.plan.summary_budget,
                before_call=renew,
            )
            summary, attempt = await database_sync_to_async(_written_commit)(run, written, token)
    except (WriteNothing, LeaseLost) as nothing:
        return await database_sync_to_async(_not_written)(run, nothing)
    return await database_sync_to_async(_compacted)(run, summary, attempt)


def _planned(
    conversation: Conversation, *, force: bool, dry_run: bool, incoming: Incoming
) -> _Run | CompactionResult:
    """The snapshot's run when it compacts; else what the compaction answers without a
    summarizer call (a dry run, nothing to compact, a range that gave no gain before)."""
    run = _snapshot(conversation, force=force, incoming=incoming)
    if dry_run or not run.plan.compacts:
        return _planned_only(run, dry_run=dry_run)
    if _had_no_gain(run):
        return _skipped(run, Reason.NO_GAIN, archived=run.archived)
    return run


def _snapshot(conversation: Conversation, *, force: bool, incoming: Incoming) -> _Run:
    db = write_db(conversation)
    conversation.update_from(Conversation.objects.using(db).get(pk=conversation.pk))
    context = context_get(conversation=conversation)
    policy = conversation_policy(conversation)
    # What a summarizer call costs is weighed only for a compaction that may not pay.
    due = not force and context_over(policy, context, incoming)
    prompt_tokens, blocks_growth = payoff_sizing(conversation) if due else (None, 0)
    sizing = Sizing(
        target_ratio=ctxsum_settings.TARGET_RATIO,
        landing=ctxsum_settings.LANDING,
        summary_max_tokens=ctxsum_settings.SUMMARY_MAX_TOKENS,
        summary_overhead=summary_size("", conversation),
        prompt_tokens=prompt_tokens,
        blocks_growth=blocks_growth,
    )
    plan = plan_compaction(
        context.layout,
        context.body,
        policy=policy,
        force=force,
        sizing=sizing,
        incoming=incoming,
    )
    archive = plan.archive
    archived = [row for row in context.body_rows if archive and row.seq in archive]
    so_far, source = summary_source(context.summary, archived, db=db) if archived else (None, [])
    return _Run(
        context=context,
        plan=plan,
        policy=policy,
        archived=archived,
        force=force,
        db=db,
        incoming=incoming,
        so_far=so_far,
        source=source,
    )


def summary_source(
    previous: Summary | None, archived: list[Message], *, db: str
) -> tuple[Summary | None, list[Message]]:
    """What a compaction's summarizer reads: ``previous`` and the newly ``archived``
    messages; or, when ``previous`` was withheld after a redaction (invariant f), no summary
    so far and every archived message from the start, as they are now."""
    if previous is None or not previous.covers_redacted:
        return previous, archived
    earlier = Message.objects.using(db).filter(conversation_id=previous.conversation_id)
    return None, [*earlier.archived().order_by("seq"), *archived]


def _had_no_gain(run: _Run) -> bool:
    """Whether this range, or a longer one from the same start, already gave no gain: it is
    not sent to the summarizer again until it has grown."""
    return (
        CompactionAttempt.objects.using(run.db)
        .filter(
            conversation=run.conversation,
            reason=Reason.NO_GAIN,
            from_seq=run.archived[0].seq,
            to_seq__gte=run.archived[-1].seq,
        )
        .exists()
    )


def _written_commit(run: _Run, written: Written, token: str) -> tuple[Summary, CompactionAttempt]:
    """Commit what the summarizer wrote, unless it gains nothing (NoGain)."""
    gain_check(written, replaced_tokens=_replaced(run))
    return _commit(run, written, token)


def _not_written(run: _Run, nothing: WriteNothing | LeaseLost) -> CompactionResult:
    """The answer of a compaction that wrote nothing: no gain, or a race lost."""
    if isinstance(nothing, NoGain):
        return _skipped(run, Reason.NO_GAIN, archived=run.archived)
    return _skipped(run, Reason.CONFLICT, archived=run.archived, outcome=Outcome.CONFLICT)


def _compacted(run: _Run, summary: Summary, attempt: CompactionAttempt) -> CompactionResult:
    """The answer of a compaction that committed, with the context it left."""
    conversation = run.conversation
    try:
        conversation.update_from(Conversation.objects.using(run.db).get(pk=conversation.pk))
        context: ActiveContext | None = context_get(conversation=conversation)
    except DatabaseError:  # the compaction stands: whoever asked is told it compacted
        logger.exception("Conversation %s compacted; its context was not read.", conversation.pk)
        context = None
    return CompactionResult(
        compacted=True,
        reason=Reason.COMPACTED,
        context=context,
        plan=run.plan,
        summary=summary,
        attempt=attempt,
        archived=run.archived,
        over_trigger=run.over(context) if context else run.plan.over_trigger,
    )


def _replaced(run: _Run) -> int:
    """Tokens of what the new summary replaces: the archived messages and the old summary."""
    replaced = sum(row.token_count for row in run.archived)
    return replaced + (run.context.summary.token_count if run.context.summary else 0)


def gain_check(written: Written, *, replaced_tokens: int) -> None:
    """Raise NoGain unless the summary is smaller than what it replaces in the context."""
    if written.token_count >= replaced_tokens:
        raise NoGain


def _commit(run: _Run, written: Written, token: str) -> tuple[Summary, CompactionAttempt]:
    """Insert the summary and archive the covered messages, if the snapshot still holds."""
    previous, archived = run.context.summary, run.archived
    checked = summary_coverage(run.so_far, run.source, written.text)
    event = SummaryCommitted(facts=written.facts)
    hooks = concerned(run.conversation, event, db=run.db)
    with transaction.atomic(using=run.db):
        held = commit_lock(run.conversation, hooks, event, db=run.db)  # before the row's lock
        locked = _lock_snapshot(run, token)
        first = previous.from_seq if previous else archived[0].seq
        summary = summary_insert(
            locked, previous, written, checked, from_seq=first, to_seq=archived[-1].seq
        )
        _archive(locked, summary, archived)
        # The context must still shrink, the blocks included.
        room = _replaced(run) - written.token_count - 1
        commit_apply(held, replace(event, summary=summary, room=room), locked=locked)
        # The counters: the new summary replaces the old one and the archived rows.
        archived_tokens = sum(row.token_count for row in archived)
        old_summary_tokens = previous.token_count if previous else 0
        locked.active_message_count -= len(archived)
        locked.active_tokens += summary.token_count - old_summary_tokens - archived_tokens
        locked.archived_message_count += len(archived)
        locked.archived_tokens += archived_tokens
        attempt = commit_save(
            locked,
            outcome=Outcome.COMPACTED,
            reason=Reason.COMPACTED,
            summary=summary,
            forced=run.force,
            tokens_before=run.plan.tokens_before,
            messages_archived=len(archived),
            from_seq=archived[0].seq,
            to_seq=archived[-1].seq,
        )
        signal_after_commit("summary_created", locked, db=run.db, summary=summary, attempt=attempt)
    return summary, attempt


def _lock_snapshot(run: _Run, token: str) -> Conversation:
    """The conversation row, locked (filtered on the lease), if the snapshot still holds;
    raises _Conflict, LeaseLost or DoesNotExist."""
    locked = lease_lock(run.conversation, token, db=run.db)
    if not active_summary_is(locked, run.context.summary):
        raise _Conflict
    # Read again from the start: a message among them redacted since must not be committed
    # in a summary (invariant f). The newly archived ones alone are checked by _archive.
    earlier = run.source[: -len(run.archived)] if run.so_far is None else []
    if not redactions_unchanged(locked, earlier):
        raise _Conflict
    # A result that arrived during the call for a request being archived would be left
    # without it (invariant d). Results arriving after the commit are refused at append.
    call_ids = {call["id"] for row in run.archived for call in row.tool_calls or ()}
    late_results = Message.objects.using(run.db).filter(
        conversation=locked,
        seq__gt=run.context.layout.body_seqs[-1],
        role="tool",
        tool_call_id__in=call_ids,
    )
    if call_ids and late_results.exists():
        raise _Conflict
    return locked


def active_summary_is(locked: Conversation, expected: Summary | None) -> bool:
    """Whether the active summary is still ``expected`` (None: still none), and no message
    it covers was redacted since it was read (its text withheld meanwhile)."""
    active = Summary.objects.using(locked._state.db).filter(conversation=locked, active=True)
    found = single(active.values_list("pk", "covers_redacted"))
    return found == ((expected.pk, expected.covers_redacted) if expected else None)


def redactions_unchanged(locked: Conversation, rows: list[Message]) -> bool:
    """Whether no message of ``rows`` (seq-ordered, every non-leading message between the
    first and the last) was redacted since it was read; the caller holds the row lock."""
    if not rows:
        return True
    now = Message.objects.using(locked._state.db).filter(
        conversation=locked,
        seq__gte=rows[0].seq,
        seq__lte=rows[-1].seq,
        is_leading=False,
        redacted_at__isnull=False,
    )
    return now.count() == sum(row.redacted_at is not None for row in rows)


def summary_insert(
    locked: Conversation,
    previous: Summary | None,
    written: Written,
    checked: Coverage,
    *,
    from_seq: int,
    to_seq: int,
    origin: str = Summary.Origin.COMPACTION,
) -> Summary:
    """Store ``written`` as the active summary in place of ``previous`` (superseded when a
    rebuild replaces it), under the next free version number (a revert leaves versions
    above ``previous`` taken). The caller holds the row lock."""
    db = locked._state.db
    if previous is not None:
        superseded = origin == Summary.Origin.REBUILD
        Summary.objects.using(db).filter(pk=previous.pk).update(active=False, superseded=superseded)
        previous.active, previous.superseded = False, superseded
    newest = Summary.objects.using(db).filter(conversation=locked).aggregate(Max("version"))
    locked.summary_count += 1  # saved by commit_save
    return Summary.objects.using(db).create(
        conversation=locked,
        version=(newest["version__max"] or 0) + 1,
        text=written.text,
        **current_prompt(),
        model=written.model,
        from_seq=from_seq,
        to_seq=to_seq,
        previous=previous,
        input_tokens=written.input_tokens,
        output_tokens=written.output_tokens,
        latency_ms=written.latency_ms,
        token_count=written.token_count,
        origin=origin,
        coverage=checked.ratio,
        coverage_facts=checked.as_json(),
        facts_skipped=written.facts_skipped,
    )


def _archive(locked: Conversation, summary: Summary, archived: list[Message]) -> None:
    # One UPDATE for the range, which matches exactly the snapshot's messages unless the
    # context changed (or one was redacted: invariant f); then the count differs. A message
    # taken back meanwhile (message_pop) frees its seq for the next append: the row stored
    # there since is newer than any the snapshot read, so it does not count.
    was_redacted = [row.pk for row in archived if row.redacted_at is not None]
    as_read = Q(redacted_at__isnull=True)
    if was_redacted:
        as_read |= Q(pk__in=was_redacted)
    updated = (
        Message.objects.using(locked._state.db)
        .filter(
            as_read,
            conversation=locked,
            pk__lte=max(row.pk for row in archived),
            seq__gte=archived[0].seq,
            seq__lte=archived[-1].seq,
            is_leading=False,
        )
        .active()
        .update(summary=summary)
    )
    if updated != len(archived):
        raise _Conflict


# What a commit changes on the conversation row.
COMMIT_FIELDS = (
    "active_message_count",
    "active_tokens",
    "archived_message_count",
    "archived_tokens",
    "summary_count",
    "compaction_count",
    "facts_tokens",
    "revision",
    "lease_owner",
    "leased_at",
    "updated_at",
)


def commit_save(locked: Conversation, **attempt: Any) -> CompactionAttempt:
    """Save a commit's counters with ``revision`` moved and the lease released, and record
    its attempt: the fields ``attempt`` gives, and the context's tokens after."""
    locked.revision += 1
    locked.compaction_count += int(attempt["outcome"] == CompactionAttempt.Outcome.COMPACTED)
    locked.lease_owner = ""
    locked.leased_at = None
    locked.save(update_fields=COMMIT_FIELDS)
    attempts = CompactionAttempt.objects.using(locked._state.db)
    return attempts.create(conversation=locked, tokens_after=locked.context_tokens, **attempt)


def attempt_record(conversation: Conversation, *, db: str, **fields: Any) -> CompactionAttempt:
    """Record an attempt that changed nothing; DoesNotExist if the conversation is gone."""
    with transaction.atomic(using=db):
        # Locked, so a concurrent delete either waits for this row or has already won.
        rows = Conversation.objects.using(db).select_for_update()
        if not rows.filter(pk=conversation.pk).exists():
            raise Conversation.DoesNotExist
        return CompactionAttempt.objects.using(db).create(conversation=conversation, **fields)


def _record(
    run: _Run, outcome: str, reason: Reason, *, archived: list[Message], error: str = ""
) -> CompactionAttempt:
    return attempt_record(
        run.conversation,
        db=run.db,
        outcome=outcome,
        reason=reason,
        error=error,
        forced=run.force,
        tokens_before=run.plan.tokens_before,
        tokens_after=run.plan.tokens_before,
        from_seq=archived[0].seq if archived else None,
        to_seq=archived[-1].seq if archived else None,
    )


def _planned_only(run: _Run, *, dry_run: bool) -> CompactionResult:
    """A dry run, or a plan that compacts nothing: no lease, no call, no change."""
    plan = run.plan
    reason = Reason.DRY_RUN if dry_run and plan.compacts else plan.reason
    if not dry_run and reason in RECORDED_SKIPS:
        _record(run, Outcome.SKIPPED, reason, archived=[])
    over = plan.over_trigger if plan.compacts else run.over(run.context)
    return CompactionResult(
        compacted=False,
        reason=reason,
        context=run.context,
        plan=plan,
        archived=run.archived,
        over_trigger=over and reason != Reason.BELOW_TRIGGER,
    )


def _skipped(
    run: _Run, reason: Reason, *, archived: list[Message], outcome: str = Outcome.SKIPPED
) -> CompactionResult:
    """A compaction that was due but did not happen; recorded with the range it planned."""
    attempt = _record(run, outcome, reason, archived=archived)
    return CompactionResult(
        compacted=False,
        reason=reason,
        context=run.context,
        plan=run.plan,
        attempt=attempt,
        archived=archived,
        over_trigger=run.over(run.context),
    )


def failure_log(error: BaseException) -> Callable[..., None]:
    """A warning for a summarizer's failure or an interruption; a traceback for a bug."""
    operational = isinstance(error, SummarizerError) or not isinstance(error, Exception)
    return logger.warning if operational else logger.exception


def _failed(run: _Run, error: BaseException) -> None:
    reason = failure_reason(error)
    failure_log(error)("Compaction of conversation %s failed: %s", run.conversation.pk, error)
    detail = f"{type(error).__name__}: {error}"
    attempt = _record(run, Outcome.FAILED, reason, archived=run.archived, error=detail)
    signal_after_commit(
        "compaction_failed", run.conversation, db=run.db, attempt=attempt, error=error
    )


def signal_after_commit(name: str, conversation: Conversation, *, db: str, **kwargs: Any) -> None:
    """Send the signal ``name`` of ``ctxsum.signals`` for ``conversation`` once the
    transaction on ``db`` commits; a receiver's error is logged (``after_commit``)."""
    signal = getattr(signals, name)
    send = partial(signal.send, sender=Conversation, conversation=conversation, **kwargs)
    after_commit(send, using=db, what=f"{name} of conversation {conversation.pk}")
