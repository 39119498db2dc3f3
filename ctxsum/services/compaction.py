"""Compaction: replace the oldest messages of the active context with an LLM summary.

The discipline (docs/architecture.md): read a snapshot, take a short lease with one
conditional UPDATE, call the summarizer outside every transaction (renewing the lease before
each call), then lock again and commit only if what the snapshot saw is still true. A slow
LLM call never holds a row lock or blocks an append; a failure before the commit leaves the
conversation exactly as it was; losing a race wastes a summary, never a message.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ctxsum import formatting, tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import SummarizerError, SummaryTruncated
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Plan, Policy, Reason, Sizing, parse_policy, plan_compaction
from ctxsum.selectors import ActiveContext, context_get, summary_message
from ctxsum.signals import compaction_failed, summary_created
from ctxsum.summarizers import get_summarizer
from ctxsum.summarizers.base import BLANK_SUMMARY

logger = logging.getLogger("ctxsum.compaction")

# Room kept in every summarizer call for the summary so far and the instruction's framing.
MIN_CHUNK_BUDGET = 256
BUDGET_TOO_SMALL = (
    "SUMMARY_INPUT_BUDGET leaves {budget} tokens for history after the prompt and the "
    "summary so far; raise it."
)
# Told to the model after the prompt: the summary's length budget for this compaction.
LENGTH_BUDGET = "Keep the summary under {tokens} tokens (about {words} words)."
# Seconds a lease outlives the summarizer timeout when LEASE_SECONDS is not set: the time
# between the answer and the commit.
LEASE_GRACE_SECONDS = 5
# Reasons recorded as skipped attempts; below_trigger is the normal case and is not recorded.
RECORDED_SKIPS = (Reason.NOTHING_TO_SUMMARIZE, Reason.IN_PROGRESS, Reason.NO_GAIN)
Outcome = CompactionAttempt.Outcome


class _Conflict(Exception):
    """The snapshot no longer matches the database: roll back, write nothing."""


class _NoGain(Exception):
    """The summary is not smaller than what it would replace: write nothing."""


@dataclass(kw_only=True)
class CompactionResult:
    """What a compaction did; ``reason`` says why when nothing was compacted.

    ``over_trigger``: the context (as compacted, or as a dry run would leave it) still
    reaches the trigger or exceeds ``max_context_tokens``.
    """

    compacted: bool
    reason: Reason
    context: ActiveContext
    plan: Plan | None = None
    summary: Summary | None = None
    attempt: CompactionAttempt | None = None
    archived: list[Message] = field(default_factory=list)  # archived, or would be on a dry run
    over_trigger: bool = False


@dataclass(frozen=True, kw_only=True)
class _Written:
    text: str
    model: str
    token_count: int  # of the summary as a context message
    input_tokens: int
    output_tokens: int
    latency_ms: int


def conversation_policy(conversation: Conversation) -> Policy:
    """The conversation's policy: each override replaces the settings' default as a whole."""
    return parse_policy(
        conversation.trigger or ctxsum_settings.TRIGGER,
        conversation.keep or ctxsum_settings.KEEP,
        conversation.max_context_tokens or ctxsum_settings.MAX_CONTEXT_TOKENS,
    )


def summary_model(conversation: Conversation) -> str:
    """The model that writes the conversation's summaries: SUMMARY_MODEL, else its own."""
    return ctxsum_settings.SUMMARY_MODEL or conversation.model or ctxsum_settings.DEFAULT_MODEL


def lease_seconds() -> float:
    """How long a lease holds without renewal: LEASE_SECONDS, else one summarizer call."""
    return ctxsum_settings.LEASE_SECONDS or ctxsum_settings.SUMMARY_TIMEOUT + LEASE_GRACE_SECONDS


def prompt_sha256(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()


def over_trigger(context: ActiveContext, policy: Policy) -> bool:
    """Whether the context still reaches its trigger or exceeds its ceiling."""
    return policy.over(len(context.messages), context.token_count)


def failure_reason(error: Exception) -> Reason:
    """The reason a failed compaction is recorded with."""
    if isinstance(error, SummaryTruncated):
        return Reason.SUMMARY_TRUNCATED
    if isinstance(error, SummarizerError):
        return Reason.SUMMARIZER_ERROR
    return Reason.ERROR


def _sizing(conversation: Conversation) -> Sizing:
    overhead = tokens.count_message(summary_message(""), model=conversation.model or None)
    return Sizing(
        target_ratio=ctxsum_settings.TARGET_RATIO,
        summary_max_tokens=ctxsum_settings.SUMMARY_MAX_TOKENS,
        summary_overhead=overhead,
    )


def _archived_rows(context: ActiveContext, plan: Plan) -> list[Message]:
    # The context is [leading row] + [summary] + rows; plan.start skips exactly those pinned.
    first = int(context.leading)
    return context.rows[first : first + plan.cutoff - plan.start]


def _lease(conversation: Conversation) -> str | None:
    """Claim the conversation for one compaction with one conditional UPDATE; None when
    another worker holds a live lease. An abandoned lease (older than the lease time) is
    taken over."""
    token = uuid.uuid4().hex
    now = timezone.now()
    free = Q(lease_owner="") | Q(leased_at__lte=now - timedelta(seconds=lease_seconds()))
    # A queryset update leaves updated_at alone: the lease is bookkeeping, not a change.
    if Conversation.objects.filter(free, pk=conversation.pk).update(
        lease_owner=token, leased_at=now
    ):
        return token
    if not Conversation.objects.filter(pk=conversation.pk).exists():
        raise Conversation.DoesNotExist
    return None


def _renew(conversation: Conversation, token: str) -> None:
    """Extend the lease before another summarizer call; losing it is a conflict."""
    if not Conversation.objects.filter(pk=conversation.pk, lease_owner=token).update(
        leased_at=timezone.now()
    ):
        raise _Conflict


def _release(conversation: Conversation, token: str) -> None:
    Conversation.objects.filter(pk=conversation.pk, lease_owner=token).update(
        lease_owner="", leased_at=None
    )


def summary_prompt(budget: int) -> str:
    """The instruction a summarizer call gets: PROMPT, then this summary's length budget."""
    length = LENGTH_BUDGET.format(tokens=budget, words=budget * 3 // 4)
    return f"{ctxsum_settings.PROMPT}\n\n{length}"


def history_room(prompt: str, count: Callable[[str], int]) -> int:
    """Tokens of formatted history one summarizer call can take beside ``prompt`` and the
    answer."""
    return ctxsum_settings.SUMMARY_INPUT_BUDGET - count(prompt) - ctxsum_settings.SUMMARY_MAX_TOKENS


def _summarize(context: ActiveContext, archived: list[Message], plan: Plan, token: str) -> _Written:
    """Write the new summary from the previous one plus the archived messages, in as many
    calls as the summarizer's input budget needs: every archived message reaches it."""
    conversation = context.conversation
    summarizer = get_summarizer()
    model = summary_model(conversation)
    prompt = summary_prompt(plan.summary_budget)

    def count(text: str) -> int:
        return tokens.count_text(text, model=conversation.model or None)

    room = history_room(prompt, count)
    if room < MIN_CHUNK_BUDGET:
        raise SummarizerError(BUDGET_TOO_SMALL.format(budget=room))
    chunks = formatting.chunk_history(
        [row.as_openai() for row in archived], budget=room, count=count
    )
    text = context.summary.text if context.summary else None
    input_tokens = output_tokens = 0
    started = time.monotonic()
    for index, chunk in enumerate(chunks):
        if index:
            _renew(conversation, token)
        history = formatting.with_summary_so_far(text, chunk)
        text = summarizer.summarize(
            prompt=prompt, history=history, model=model, budget=plan.summary_budget
        )
        if not text or not text.strip():
            raise SummarizerError(BLANK_SUMMARY)
        text = text.strip()
        input_tokens += count(prompt) + count(history)
        output_tokens += count(text)
    assert text is not None  # chunk_history returns at least one chunk for a non-empty list
    size = tokens.count_message(summary_message(text), model=conversation.model or None)
    return _Written(
        text=text,
        model=model,
        token_count=size,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        latency_ms=int((time.monotonic() - started) * 1000),
    )


def _check_gain(context: ActiveContext, archived: list[Message], written: _Written) -> None:
    replaced = sum(row.token_count for row in archived)
    replaced += context.summary.token_count if context.summary else 0
    if written.token_count >= replaced:
        raise _NoGain


def _lock_snapshot(context: ActiveContext, archived: list[Message], token: str) -> Conversation:
    """The conversation row, locked, if the snapshot still holds; raises _Conflict (or
    DoesNotExist when the conversation was deleted meanwhile)."""
    pk = context.conversation.pk
    locked = Conversation.objects.select_for_update().filter(pk=pk, lease_owner=token).first()
    if locked is None:
        if not Conversation.objects.filter(pk=pk).exists():
            raise Conversation.DoesNotExist
        raise _Conflict  # the lease was taken over: another worker is summarizing
    previous = context.summary
    active = Summary.objects.filter(conversation=locked, active=True).values_list("pk", flat=True)
    if active.first() != (previous and previous.pk):
        raise _Conflict
    # A result that arrived during the call for a request being archived would be left
    # without it (invariant d). Results arriving after the commit are refused at append.
    call_ids = {call["id"] for row in archived for call in row.tool_calls or ()}
    if call_ids and (
        Message.objects.filter(
            conversation=locked,
            seq__gt=context.rows[-1].seq,
            role="tool",
            tool_call_id__in=call_ids,
        ).exists()
    ):
        raise _Conflict
    return locked


def _insert_summary(
    locked: Conversation, previous: Summary | None, archived: list[Message], written: _Written
) -> Summary:
    if previous is not None:
        Summary.objects.filter(pk=previous.pk).update(active=False)
        previous.active = False
    return Summary.objects.create(
        conversation=locked,
        version=previous.version + 1 if previous else 1,
        text=written.text,
        prompt_version=ctxsum_settings.PROMPT_VERSION,
        prompt_sha256=prompt_sha256(ctxsum_settings.PROMPT),
        model=written.model,
        from_seq=previous.from_seq if previous else archived[0].seq,
        to_seq=archived[-1].seq,
        previous=previous,
        input_tokens=written.input_tokens,
        output_tokens=written.output_tokens,
        latency_ms=written.latency_ms,
        token_count=written.token_count,
    )


def _archive(locked: Conversation, summary: Summary, archived: list[Message]) -> None:
    # One UPDATE for the whole range. Under the row lock nobody else can archive, so the
    # range holds exactly the snapshot's messages unless the context changed meanwhile:
    # then the count differs and everything rolls back.
    updated = (
        Message.objects.filter(
            conversation=locked,
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
    "revision",
    "lease_owner",
    "leased_at",
    "updated_at",
)


def _move_counters(
    locked: Conversation, previous: Summary | None, summary: Summary, archived: list[Message]
) -> None:
    """The new summary replaces the old one and the archived rows: counters, revision, and
    the lease released in the same write."""
    archived_tokens = sum(row.token_count for row in archived)
    old_summary_tokens = previous.token_count if previous else 0
    locked.active_message_count -= len(archived)
    locked.active_tokens += summary.token_count - old_summary_tokens - archived_tokens
    locked.revision += 1
    locked.lease_owner = ""
    locked.leased_at = None
    locked.save(update_fields=COMMIT_FIELDS)


def _commit(
    context: ActiveContext,
    plan: Plan,
    archived: list[Message],
    written: _Written,
    token: str,
    *,
    force: bool,
) -> tuple[Summary, CompactionAttempt]:
    """Insert the summary and archive the covered messages, if the snapshot still holds."""
    previous = context.summary
    with transaction.atomic():
        locked = _lock_snapshot(context, archived, token)
        summary = _insert_summary(locked, previous, archived, written)
        _archive(locked, summary, archived)
        _move_counters(locked, previous, summary, archived)
        attempt = CompactionAttempt.objects.create(
            conversation=locked,
            outcome=Outcome.COMPACTED,
            reason=Reason.COMPACTED,
            summary=summary,
            forced=force,
            tokens_before=plan.tokens_before,
            tokens_after=tokens.context_tokens([locked.active_tokens]),
            messages_archived=len(archived),
            from_seq=archived[0].seq,
            to_seq=archived[-1].seq,
        )
        transaction.on_commit(
            partial(
                summary_created.send,
                sender=Conversation,
                conversation=locked,
                summary=summary,
                attempt=attempt,
            )
        )
    return summary, attempt


def _record(
    conversation: Conversation,
    outcome: str,
    reason: Reason,
    plan: Plan | None,
    *,
    force: bool,
    archived: list[Message] | None = None,
    error: str = "",
) -> CompactionAttempt:
    """Record an attempt that changed nothing; DoesNotExist if the conversation is gone."""
    with transaction.atomic():
        # Locked, so a concurrent delete either waits for this row or has already won.
        if not Conversation.objects.select_for_update().filter(pk=conversation.pk).exists():
            raise Conversation.DoesNotExist
        return CompactionAttempt.objects.create(
            conversation=conversation,
            outcome=outcome,
            reason=reason,
            error=error,
            forced=force,
            tokens_before=plan.tokens_before if plan else 0,
            tokens_after=plan.tokens_before if plan else 0,
            from_seq=archived[0].seq if archived else None,
            to_seq=archived[-1].seq if archived else None,
        )


def _had_no_gain(conversation: Conversation, archived: list[Message]) -> bool:
    """Whether this range, or a longer one from the same start, already gave no gain: it is
    not sent to the summarizer again until it has grown."""
    return CompactionAttempt.objects.filter(
        conversation=conversation,
        reason=Reason.NO_GAIN,
        from_seq=archived[0].seq,
        to_seq__gte=archived[-1].seq,
    ).exists()


def conversation_compact(
    *, conversation: Conversation, force: bool = False, dry_run: bool = False
) -> CompactionResult:
    """Compact the conversation if its trigger is reached (or ``force``).

    Returns what happened; ``reason`` says why nothing was done. Raises SummarizerError when
    the summarizer fails: nothing changes then, the failure is recorded, and no retry is made.
    Raises Conversation.DoesNotExist when the conversation is deleted meanwhile.
    ``dry_run`` plans only: no lease, no LLM call, no write.
    """
    conversation = Conversation.objects.get(pk=conversation.pk)
    context = context_get(conversation=conversation)
    policy = conversation_policy(conversation)
    plan = plan_compaction(
        context.messages,
        context.tokens,
        leading=context.leading,
        has_summary=context.summary is not None,
        policy=policy,
        force=force,
        sizing=_sizing(conversation),
    )
    archived = _archived_rows(context, plan) if plan.compacts else []
    if dry_run or not plan.compacts:
        return _planned_only(context, plan, policy, archived, force=force, dry_run=dry_run)
    if _had_no_gain(conversation, archived):
        return _skipped(context, plan, Reason.NO_GAIN, policy, force=force, archived=archived)
    token = _lease(conversation)
    if token is None:
        return _skipped(context, plan, Reason.IN_PROGRESS, policy, force=force)
    return _compact_leased(context, plan, policy, archived, token, force=force)


def _compact_leased(
    context: ActiveContext,
    plan: Plan,
    policy: Policy,
    archived: list[Message],
    token: str,
    *,
    force: bool,
) -> CompactionResult:
    """Summarize and commit under the lease ``token``; release it whatever happens."""
    conversation = context.conversation
    try:
        # Outside every transaction: the LLM call may take seconds and holds no lock.
        written = _summarize(context, archived, plan, token)
        _check_gain(context, archived, written)
        summary, attempt = _commit(context, plan, archived, written, token, force=force)
    except (_Conflict, _NoGain) as error:
        _release(conversation, token)
        reason = Reason.CONFLICT if isinstance(error, _Conflict) else Reason.NO_GAIN
        outcome = Outcome.CONFLICT if reason == Reason.CONFLICT else Outcome.SKIPPED
        return _skipped(
            context, plan, reason, policy, force=force, archived=archived, outcome=outcome
        )
    except Conversation.DoesNotExist:
        raise  # deleted meanwhile: nothing left to release or record
    except Exception as error:
        _release(conversation, token)
        _failed(conversation, plan, archived, error, force=force)
        raise
    conversation.refresh_from_db()
    context = context_get(conversation=conversation)
    return CompactionResult(
        compacted=True,
        reason=Reason.COMPACTED,
        context=context,
        plan=plan,
        summary=summary,
        attempt=attempt,
        archived=archived,
        over_trigger=over_trigger(context, policy),
    )


def _planned_only(
    context: ActiveContext,
    plan: Plan,
    policy: Policy,
    archived: list[Message],
    *,
    force: bool,
    dry_run: bool,
) -> CompactionResult:
    """A dry run, or a plan that compacts nothing: no lease, no call, no change."""
    reason = Reason.DRY_RUN if dry_run and plan.compacts else plan.reason
    if not dry_run and reason in RECORDED_SKIPS:
        _record(context.conversation, Outcome.SKIPPED, reason, plan, force=force)
    over = plan.over_trigger if plan.compacts else over_trigger(context, policy)
    return CompactionResult(
        compacted=False,
        reason=reason,
        context=context,
        plan=plan,
        archived=archived,
        over_trigger=over and reason != Reason.BELOW_TRIGGER,
    )


def _skipped(
    context: ActiveContext,
    plan: Plan,
    reason: Reason,
    policy: Policy,
    *,
    force: bool,
    archived: list[Message] | None = None,
    outcome: str = Outcome.SKIPPED,
) -> CompactionResult:
    attempt = _record(context.conversation, outcome, reason, plan, force=force, archived=archived)
    return CompactionResult(
        compacted=False,
        reason=reason,
        context=context,
        plan=plan,
        attempt=attempt,
        archived=archived or [],
        over_trigger=over_trigger(context, policy),
    )


def _failed(
    conversation: Conversation,
    plan: Plan,
    archived: list[Message],
    error: Exception,
    *,
    force: bool,
) -> None:
    reason = failure_reason(error)
    # A summarizer failure is an operational event; anything else is a bug: its traceback.
    log = logger.warning if isinstance(error, SummarizerError) else logger.exception
    log("Compaction of conversation %s failed: %s", conversation.pk, error)
    attempt = _record(
        conversation,
        Outcome.FAILED,
        reason,
        plan,
        force=force,
        archived=archived,
        error=f"{type(error).__name__}: {error}",
    )
    transaction.on_commit(
        partial(
            compaction_failed.send,
            sender=Conversation,
            conversation=conversation,
            attempt=attempt,
            error=error,
        )
    )


@dataclass(frozen=True, kw_only=True)
class AutoCompaction:
    """What the automatic compaction after an append did, for the append's answer."""

    compacted: bool
    reason: str
    summary_version: int | None = None
    over_trigger: bool = False
    detail: str = ""


def conversation_autocompact(*, conversation: Conversation) -> AutoCompaction | None:
    """After an append has committed: compact if AUTO_COMPACT is on and the trigger is
    reached. Never raises (the append stands whatever happens here); returns what happened,
    or None when auto compaction is off.

    Inside a caller's transaction the compaction waits for it to commit (reason
    ``deferred``): the summarizer call must not run while the append's row lock is held.
    """
    if not ctxsum_settings.AUTO_COMPACT:
        return None
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(partial(_autocompact, conversation))
        return AutoCompaction(compacted=False, reason=Reason.DEFERRED)
    return _autocompact(conversation)


def _autocompact(conversation: Conversation) -> AutoCompaction:
    try:
        result = conversation_compact(conversation=conversation)
    except SummarizerError as error:
        return AutoCompaction(compacted=False, reason=failure_reason(error), detail=str(error))
    except Conversation.DoesNotExist:
        return AutoCompaction(
            compacted=False, reason=Reason.CONFLICT, detail="The conversation was deleted."
        )
    except Exception as error:
        logger.exception("Automatic compaction of conversation %s failed.", conversation.pk)
        return AutoCompaction(compacted=False, reason=Reason.ERROR, detail=type(error).__name__)
    return AutoCompaction(
        compacted=result.compacted,
        reason=result.reason,
        summary_version=result.summary.version if result.summary else None,
        over_trigger=result.over_trigger,
    )
