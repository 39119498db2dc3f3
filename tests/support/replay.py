"""Replaying one real conversation through ctxsum the way an application would use it:
the conversation created with a small policy, each original message appended on its own
with ``message_append``, ``conversation_compact`` called after every append, and every
step checked and measured. The full replay (``python -m bench.replay``) and
tests/test_replay.py share it. Importing it needs Django configured (it imports the
models)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection, reset_queries
from django.test.utils import CaptureQueriesContext

from ctxsum import tokens
from ctxsum.policy import LEADING_ROLES, Reason
from ctxsum.services.compaction import conversation_compact
from ctxsum.services.conversations import conversation_create
from ctxsum.services.messages import message_append
from ctxsum.services.redaction import message_redact
from tests import invariants
from tests.support.replay_checks import no_gain_problems, replaced_tokens, summary_problems
from tests.support.replay_stats import (
    REDUCTION_FROM_TURN,
    ReplayStats,
    compaction_kind,
    message_updates,
)
from tests.support.shared import REPO_ROOT
from tests.support.summarizer_calls import SummarizerCall, summarizer_calls

TRIGGER = {"messages": 12}
KEEP = {"messages": 6}
# Sizes of the one-shot compactions that show the query count does not grow with the
# number of messages archived.
PROBE_SIZES = (4, 16, 64, 128, 192)

Checker = Callable[..., Any]


class ReplayViolation(AssertionError):
    """A step of the replay broke an invariant (or raised): which conversation, which step."""

    def __init__(self, conversation_id: str, step: int, problem: str) -> None:
        super().__init__(f"conversation {conversation_id} step {step}: {problem}")
        self.conversation_id = conversation_id
        self.step = step
        self.problem = problem


def has_leading(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the first message is pinned ahead of the history (system or developer)."""
    return bool(messages) and messages[0].get("role") in LEADING_ROLES


def invariant_checker() -> tuple[Checker, str]:
    """The invariant check shared with the test suite (tests/invariants.py: one
    implementation for both), and the file it lives in, relative to the repository."""
    source = Path(invariants.__file__).resolve().relative_to(REPO_ROOT).as_posix()
    return invariants.assert_context_invariants, source


@dataclass
class Step:
    """One message appended and one compact call after it, with their queries and time."""

    appended: Any
    result: Any
    calls: list[SummarizerCall]
    append_queries: int
    compact_queries: list[dict[str, Any]]
    append_seconds: float
    compact_seconds: float


def run_step(conversation: Any, message: Mapping[str, Any]) -> Step:
    """Append ``message`` on its own, then call ``conversation_compact``, capturing the
    queries and timing each."""
    perf = time.perf_counter
    reset_queries()
    started = perf()
    with CaptureQueriesContext(connection) as captured:
        appended = message_append(conversation=conversation, messages=[message])
    append_seconds = perf() - started
    # Read now: the capture is a slice of connection.queries, which the reset clears.
    append_queries = len(captured)
    reset_queries()
    with summarizer_calls() as calls, CaptureQueriesContext(connection) as captured:
        started = perf()
        result = conversation_compact(conversation=conversation)
        compact_seconds = perf() - started
    return Step(
        appended=appended,
        result=result,
        calls=calls,
        append_queries=append_queries,
        compact_queries=captured.captured_queries,
        append_seconds=append_seconds,
        compact_seconds=compact_seconds,
    )


@dataclass
class ConversationReplay:
    """The state of one conversation's replay between steps: the summaries so far, the
    ranges rejected as ``no_gain``, and the tokens of the full history."""

    record_id: str
    messages: list[Mapping[str, Any]]
    conversation: Any
    stats: ReplayStats
    source: str = ""
    checker: Checker | None = None
    check_size: bool = False
    check_every: int = 1
    history_tokens: int = 0
    version: int = 0
    reduction: float = 0.0
    summary: Any = None  # the active summary
    rejected: dict[int, int] = field(default_factory=dict)  # from_seq -> furthest to_seq

    def violation(self, step: int, problem: str) -> ReplayViolation:
        return ReplayViolation(self.record_id, step, problem)

    def play(self) -> Any:
        """Every step, then the conversation's totals; returns the conversation."""
        self.stats.reductions_by_file.setdefault(self.source, [])
        for number, message in enumerate(self.messages, start=1):
            self.step(number, message)
        per_file = self.stats.per_file.setdefault(self.source, Counter())
        per_file.update(conversations=1, messages=len(self.messages), compactions=self.version)
        self.stats.conversations += 1
        self.stats.final_reductions.append(self.reduction)
        return self.conversation

    def step(self, number: int, message: Mapping[str, Any]) -> None:
        """Step ``number``: append, compact, count and check; ReplayViolation if it broke."""
        try:
            step = run_step(self.conversation, message)
        except Exception as error:
            raise self.violation(number, f"{type(error).__name__}: {error}") from error
        if step.appended.compaction is not None:
            raise self.violation(number, "the append compacted by itself: AUTO_COMPACT must be off")
        (row,) = step.appended.messages
        result = step.result
        self.conversation = result.context.conversation
        reason = str(result.reason)
        stats = self.stats
        stats.append_seconds.append(step.append_seconds)
        stats.append_queries[step.append_queries] += 1
        stats.reasons[reason] += 1
        stats.over_trigger[reason] += bool(result.over_trigger)
        stats.summarizer_calls += len(step.calls)
        if result.compacted:
            self.record_compaction(number, step)
        else:
            self.record_skip(number, step, reason)
        self.record_size(number, result, row.token_count)
        due = number % self.check_every == 0 or number == len(self.messages)
        if self.checker is not None and (due or result.compacted):
            self.check_invariants(number)
        stats.messages += 1

    def record_compaction(self, number: int, step: Step) -> None:
        """Count and check a compaction: the summary it left, its queries and time."""
        result, stats = step.result, self.stats
        self.version += 1
        archived = len(result.archived or ())
        queries = len(step.compact_queries)
        stats.compactions += 1
        stats.archived.append(archived)
        stats.compaction_seconds.append(step.compact_seconds)
        stats.compaction_queries.append(queries)
        stats.compaction_message_updates.append(message_updates(step.compact_queries))
        stats.queries_by_archived.setdefault(archived, Counter())[queries] += 1
        kind = compaction_kind(
            version=self.version,
            archived=result.archived,
            calls=step.calls,
            queries=step.compact_queries,
        )
        stats.queries_by_kind.setdefault(kind, Counter())[queries] += 1
        problems = summary_problems(
            result,
            version=self.version,
            leading=has_leading(self.messages),
            calls=step.calls,
            previous_summary=self.summary,
        )
        if problems:
            raise self.violation(number, "; ".join(problems))
        stats.summary_budgets.append(result.plan.summary_budget)
        stats.summary_ratios.append(
            result.summary.token_count / replaced_tokens(result, self.summary)
        )
        self.summary = result.summary

    def record_skip(self, number: int, step: Step, reason: str) -> None:
        """Count a compact call that compacted nothing; check a ``no_gain`` skip, and that
        no other skip called the summarizer."""
        stats, calls = self.stats, step.calls
        stats.skipped_seconds.setdefault(reason, []).append(step.compact_seconds)
        stats.skipped_queries.setdefault(reason, Counter())[len(step.compact_queries)] += 1
        if reason == Reason.NO_GAIN:
            problems = no_gain_problems(
                step.result, calls=calls, rejected=self.rejected, previous_summary=self.summary
            )
            if problems:
                raise self.violation(number, "no_gain: " + "; ".join(problems))
            if calls:
                stats.no_gain_summarized += 1
            else:
                stats.no_gain_not_sent += 1
        elif calls:
            raise self.violation(
                number, f"{reason}, yet the summarizer was called {len(calls)} times"
            )

    def record_size(self, number: int, result: Any, appended_tokens: int) -> None:
        """The context as it would be sent, against sending every original message so far."""
        self.history_tokens += appended_tokens
        full = tokens.context_tokens([self.history_tokens])
        sent = result.context.token_count
        counted = tokens.context_tokens([self.conversation.active_tokens])
        if sent != counted:
            raise self.violation(number, f"context costs {sent} tokens, the counter says {counted}")
        self.reduction = 1 - sent / full
        self.stats.context_over_history += sent > full
        if self.check_size and sent > full:
            raise self.violation(
                number,
                f"the context costs {sent} tokens, more than the {full} of the full history",
            )
        if number >= REDUCTION_FROM_TURN:
            self.stats.reductions.append(self.reduction)
            self.stats.reductions_by_file[self.source].append(self.reduction)
        self.stats.max_active_messages = max(
            self.stats.max_active_messages, len(result.context.messages)
        )

    def check_invariants(self, number: int) -> None:
        assert self.checker is not None
        checked = time.perf_counter()
        try:
            self.checker(self.conversation, original_messages=self.messages[:number])
        except AssertionError as error:
            raise self.violation(number, f"invariant: {error}") from error
        self.stats.check_seconds += time.perf_counter() - checked
        self.stats.checked_steps += 1


def erasure_probe(
    conversation: Any, record: Mapping[str, Any], *, stats: ReplayStats, checker: Checker
) -> None:
    """After the last step, outside the step counts: redact the first archived message
    whose text is distinctive (16 characters or more, in no other message), check the
    invariants, (f) erasure included, then compact once more (forced) and check again: the
    next summary is written without the redacted text. Nothing to do for a conversation
    that archived none."""
    messages = list(record["messages"])
    texts = [m.get("content") if isinstance(m.get("content"), str) else "" for m in messages]
    archived = conversation.messages.archived().order_by("seq").values_list("seq", flat=True)
    seq = next(
        (
            seq
            for seq in archived
            if len(texts[seq]) >= 16
            and not any(texts[seq] in text for other, text in enumerate(texts) if other != seq)
        ),
        None,
    )
    if seq is None:
        return
    try:
        message_redact(conversation=conversation, seq=seq)
        checker(conversation, original_messages=messages)
        compacted = conversation_compact(conversation=conversation, force=True).compacted
        checker(conversation, original_messages=messages)
    except Exception as error:
        problem = f"erasure probe (seq {seq}): {type(error).__name__}: {error}"
        raise ReplayViolation(str(record["id"]), len(messages), problem) from error
    stats.erasure_probes += 1
    stats.erasure_probe_compactions += compacted


def replay_conversation(
    record: Mapping[str, Any],
    *,
    owner: Any,
    stats: ReplayStats | None = None,
    checker: Checker | None = None,
    source: str = "",
    check_size: bool = False,
    check_every: int = 1,
) -> Any:
    """Replay one record: create the conversation, then append each message on its own and
    call ``conversation_compact`` after each append. Raises ReplayViolation at the first
    broken step (``check_size``: a context costing more than the full history is one;
    ``check_every``: the invariants after every such step, every compaction and the last
    step); returns the conversation."""
    record_id = str(record["id"])
    conversation = conversation_create(
        owner=owner,
        title=record_id[:200],
        metadata={"replay_id": record_id, "source": str(record.get("source", ""))[:200]},
        trigger=dict(TRIGGER),
        keep=dict(KEEP),
    )
    return ConversationReplay(
        record_id=record_id,
        messages=list(record["messages"]),
        conversation=conversation,
        stats=stats if stats is not None else ReplayStats(),
        source=source,
        checker=checker,
        check_size=check_size,
        check_every=check_every,
    ).play()


def query_scaling(
    record: Mapping[str, Any],
    *,
    owner: Any,
    sizes: Sequence[int] = PROBE_SIZES,
    checker: Checker | None = None,
) -> list[dict[str, Any]]:
    """One compaction each of conversations whose first ``size`` messages after the system
    message are to be archived at once (created in one batch, compacted with the replay
    policy): the query count should not move with the size."""
    messages = list(record["messages"])
    leading = has_leading(messages)
    rows = []
    for size in sizes:
        total = int(leading) + size + KEEP["messages"]
        if total > len(messages):
            break
        conversation = conversation_create(
            owner=owner,
            title=f"probe {size} {record['id']}"[:200],
            trigger=dict(TRIGGER),
            keep=dict(KEEP),
            messages=messages[:total],
        )
        label = f"probe {size} of {record['id']}"
        rows.append(
            _probe(
                conversation,
                label=label,
                originals=messages[:total],
                leading=leading,
                checker=checker,
            )
        )
    return rows


def _probe(
    conversation: Any,
    *,
    label: str,
    originals: Sequence[Mapping[str, Any]],
    leading: bool,
    checker: Checker | None,
) -> dict[str, Any]:
    """Force one compaction of ``conversation``, check it like a replay step, and return
    its queries, summarizer calls, sizes and time."""
    reset_queries()
    with summarizer_calls() as calls, CaptureQueriesContext(connection) as captured:
        started = time.perf_counter()
        result = conversation_compact(conversation=conversation, force=True)
        seconds = time.perf_counter() - started
    if not result.compacted:
        raise ReplayViolation(label, len(originals), f"did not compact: {result.reason}")
    problems = summary_problems(result, version=1, leading=leading, calls=calls)
    if problems:
        raise ReplayViolation(label, len(originals), "; ".join(problems))
    if checker is not None:
        try:
            checker(result.context.conversation, original_messages=originals)
        except AssertionError as error:
            raise ReplayViolation(label, len(originals), f"invariant: {error}") from error
    return {
        "archived": len(result.archived or ()),
        "queries": len(captured),
        "message_updates": message_updates(captured.captured_queries),
        "kind": compaction_kind(
            version=1, archived=result.archived, calls=calls, queries=captured.captured_queries
        ),
        "summarizer_calls": len(calls),
        "summarizer_input_tokens": result.summary.input_tokens,
        "summary_budget": result.plan.summary_budget,
        "summary_tokens": result.summary.token_count,
        "ms": round(seconds * 1000, 2),
    }
