"""Compaction: replace the oldest messages of the active context with an LLM summary.

The discipline (ARCHITECTURE.md): read a snapshot, take a short lease in its own
transaction, call the summarizer outside every transaction, then lock again and commit only
if what the snapshot saw is still true. A slow LLM call never holds a row lock or blocks an
append; a failure before the commit leaves the conversation exactly as it was; losing a race
wastes a summary, never a message.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from ctxsum import formatting, tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import SummarizerError
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Plan, Policy, Reason, parse_policy, plan_compaction
from ctxsum.selectors import ActiveContext, context_get, summary_message
from ctxsum.signals import compaction_failed, summary_created
from ctxsum.summarizers import get_summarizer
from ctxsum.summarizers.base import BLANK_SUMMARY

# Room kept in every summarizer call for the summary so far and the instruction's framing.
MIN_CHUNK_BUDGET = 256
BUDGET_TOO_SMALL = (
    "SUMMARY_INPUT_BUDGET leaves {budget} tokens for history after the prompt and the "
    "summary so far; raise it."
)
# Reasons recorded as skipped attempts; below_trigger is the normal case and is not recorded.
RECORDED_SKIPS = (Reason.NOTHING_TO_SUMMARIZE, Reason.KEPT_TAIL_OVER_TRIGGER, Reason.IN_PROGRESS)


class _Conflict(Exception):
    """The snapshot no longer matches the database: roll back, write nothing."""


@dataclass
class CompactionResult:
    compacted: bool
    reason: Reason
    context: ActiveContext
    plan: Plan | None = None
    summary: Summary | None = None
    attempt: CompactionAttempt | None = None
    archived: list[Message] | None = None  # what was (or, on a dry run, would be) archived


@dataclass
class _Written:
    text: str
    input_tokens: int
    output_tokens: int
    latency_ms: int


def conversation_policy(conversation: Conversation) -> Policy:
    """The conversation's policy: each override replaces the settings' default as a whole."""
    return parse_policy(
        conversation.trigger or ctxsum_settings.TRIGGER,
        conversation.keep or ctxsum_settings.KEEP,
    )


def prompt_sha256(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()


def _archived_rows(context: ActiveContext, plan: Plan) -> list[Message]:
    # The context is [leading row] + [summary] + rows; plan.start skips exactly those pinned.
    first = int(context.leading)
    return context.rows[first : first + plan.cutoff - plan.start]


def _lease(conversation: Conversation) -> str | None:
    """Claim the conversation for one compaction; None when a fresh lease is held by
    another worker. A stale lease (older than LEASE_SECONDS) is taken over."""
    token = uuid.uuid4().hex
    stale = timezone.now() - timedelta(seconds=ctxsum_settings.LEASE_SECONDS)
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        if locked.lease_owner and locked.leased_at and locked.leased_at > stale:
            return None
        # A queryset update leaves updated_at alone: the lease is bookkeeping, not a change.
        Conversation.objects.filter(pk=locked.pk).update(
            lease_owner=token, leased_at=timezone.now()
        )
    return token


def _release(conversation: Conversation, token: str) -> None:
    Conversation.objects.filter(pk=conversation.pk, lease_owner=token).update(
        lease_owner="", leased_at=None
    )


def _summarize(context: ActiveContext, archived: list[Message]) -> _Written:
    """Write the new summary from the previous one plus the archived messages, in as many
    calls as the summarizer's input budget needs: every archived message reaches it."""
    summarizer = get_summarizer()
    prompt = ctxsum_settings.PROMPT
    model = context.conversation.model or None

    def count(text: str) -> int:
        return tokens.count_text(text, model=model)

    budget = (
        ctxsum_settings.SUMMARY_INPUT_BUDGET - count(prompt) - ctxsum_settings.SUMMARY_MAX_TOKENS
    )
    if budget < MIN_CHUNK_BUDGET:
        raise SummarizerError(BUDGET_TOO_SMALL.format(budget=budget))
    history_messages = [row.as_openai() for row in archived]
    chunks = formatting.chunk_history(history_messages, budget=budget, count=count)
    text = context.summary.text if context.summary else None
    input_tokens = output_tokens = 0
    started = time.monotonic()
    for chunk in chunks:
        history = formatting.with_summary_so_far(text, chunk)
        text = summarizer.summarize(prompt=prompt, history=history)
        if not text or not text.strip():
            raise SummarizerError(BLANK_SUMMARY)
        text = text.strip()
        input_tokens += count(prompt) + count(history)
        output_tokens += count(text)
    assert text is not None  # chunk_history returns at least one chunk for a non-empty list
    latency_ms = int((time.monotonic() - started) * 1000)
    return _Written(text, input_tokens, output_tokens, latency_ms)


def _commit(
    context: ActiveContext, plan: Plan, archived: list[Message], written: _Written, token: str
) -> tuple[Summary, CompactionAttempt]:
    """Insert the summary and archive the covered messages, if the snapshot still holds."""
    conversation = context.conversation
    previous = context.summary
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        active_summary_id = (
            Summary.objects.filter(conversation=locked, active=True)
            .values_list("pk", flat=True)
            .first()
        )
        if locked.lease_owner != token or active_summary_id != (previous and previous.pk):
            raise _Conflict
        if previous is not None:
            Summary.objects.filter(pk=previous.pk).update(active=False)
            previous.active = False
        summary = Summary(
            conversation=locked,
            version=previous.version + 1 if previous else 1,
            text=written.text,
            prompt_version=ctxsum_settings.PROMPT_VERSION,
            prompt_sha256=prompt_sha256(ctxsum_settings.PROMPT),
            model=get_summarizer().model,
            from_seq=previous.from_seq if previous else archived[0].seq,
            to_seq=archived[-1].seq,
            previous=previous,
            input_tokens=written.input_tokens,
            output_tokens=written.output_tokens,
            latency_ms=written.latency_ms,
        )
        summary.token_count = tokens.count_message(
            summary_message(summary), model=locked.model or None
        )
        summary.save()
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
        archived_tokens = sum(row.token_count for row in archived)
        old_summary_tokens = previous.token_count if previous else 0
        locked.active_message_count -= len(archived)
        locked.active_tokens += summary.token_count - old_summary_tokens - archived_tokens
        locked.revision += 1
        locked.lease_owner = ""
        locked.leased_at = None
        locked.save(
            update_fields=[
                "active_message_count",
                "active_tokens",
                "revision",
                "lease_owner",
                "leased_at",
                "updated_at",
            ]
        )
        attempt = CompactionAttempt.objects.create(
            conversation=locked,
            outcome=CompactionAttempt.Outcome.COMPACTED,
            reason=Reason.COMPACTED,
            summary=summary,
            tokens_before=plan.tokens_before,
            tokens_after=tokens.context_tokens([locked.active_tokens]),
            messages_archived=len(archived),
        )
        transaction.on_commit(
            lambda: summary_created.send(
                sender=Conversation, conversation=locked, summary=summary, attempt=attempt
            )
        )
    return summary, attempt


def _record(
    conversation: Conversation,
    outcome: str,
    reason: str,
    plan: Plan | None,
    *,
    force: bool,
    error: str = "",
) -> CompactionAttempt:
    return CompactionAttempt.objects.create(
        conversation=conversation,
        outcome=outcome,
        reason=reason,
        error=error,
        forced=force,
        tokens_before=plan.tokens_before if plan else 0,
        tokens_after=plan.tokens_before if plan else 0,
    )


def conversation_compact(
    *, conversation: Conversation, force: bool = False, dry_run: bool = False
) -> CompactionResult:
    """Compact the conversation if its trigger is reached (or ``force``).

    Returns what happened; ``reason`` says why nothing was done. Raises SummarizerError when
    the summarizer fails: nothing changes then, the failure is recorded, and no retry is made.
    ``dry_run`` plans only: no lease, no LLM call, no write.
    """
    conversation = Conversation.objects.get(pk=conversation.pk)
    context = context_get(conversation=conversation)
    plan = plan_compaction(
        context.messages,
        context.tokens,
        leading=context.leading,
        has_summary=context.summary is not None,
        policy=conversation_policy(conversation),
        force=force,
    )
    archived = _archived_rows(context, plan) if plan.compacts else []
    if dry_run or not plan.compacts:
        reason = Reason.DRY_RUN if dry_run and plan.compacts else plan.reason
        if not dry_run and reason in RECORDED_SKIPS:
            _record(conversation, CompactionAttempt.Outcome.SKIPPED, reason, plan, force=force)
        return CompactionResult(False, reason, context, plan=plan, archived=archived)

    token = _lease(conversation)
    if token is None:
        attempt = _record(
            conversation, CompactionAttempt.Outcome.SKIPPED, Reason.IN_PROGRESS, plan, force=force
        )
        return CompactionResult(False, Reason.IN_PROGRESS, context, plan=plan, attempt=attempt)

    try:
        # Outside every transaction: the LLM call may take seconds and holds no lock.
        written = _summarize(context, archived)
        summary, attempt = _commit(context, plan, archived, written, token)
    except _Conflict:
        _release(conversation, token)
        attempt = _record(
            conversation, CompactionAttempt.Outcome.CONFLICT, Reason.CONFLICT, plan, force=force
        )
        return CompactionResult(False, Reason.CONFLICT, context, plan=plan, attempt=attempt)
    except Exception as error:
        _release(conversation, token)
        attempt = _record(
            conversation,
            CompactionAttempt.Outcome.FAILED,
            "summarizer_error" if isinstance(error, SummarizerError) else "error",
            plan,
            force=force,
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
        raise
    conversation.refresh_from_db()
    return CompactionResult(
        True,
        Reason.COMPACTED,
        context_get(conversation=conversation),
        plan=plan,
        summary=summary,
        attempt=attempt,
        archived=archived,
    )


def conversation_autocompact(*, conversation: Conversation) -> dict[str, Any] | None:
    """After an append has committed: compact if AUTO_COMPACT is on and the trigger is
    reached. Never raises for a summarizer failure (the append stands); returns what
    happened for the response, or None when auto compaction is off."""
    if not ctxsum_settings.AUTO_COMPACT:
        return None
    try:
        result = conversation_compact(conversation=conversation)
    except SummarizerError as error:
        return {"compacted": False, "reason": "summarizer_error", "detail": str(error)}
    return {
        "compacted": result.compacted,
        "reason": str(result.reason),
        "summary_version": result.summary.version if result.summary else None,
    }

