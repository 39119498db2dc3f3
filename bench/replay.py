#!/usr/bin/env python
"""Replay the real conversations of ../shared/data through ctxsum, one message at a time.

Every conversation gets a small policy (trigger at 12 messages, keep 6) and the offline
summarizer (deterministic, no network). Each original message is appended on its own with
``message_append`` and ``conversation_compact`` is called after every append. The script
reports what the compact calls did (per reason: ``compacted``, ``below_trigger``,
``no_gain`` …, and how many ended ``over_trigger``), how much smaller the active context is
than the full history (and how many steps it was larger: none, since a summary that is not
smaller than what it replaces is not committed), how many SQL queries a compaction takes
(and that the archiving is one UPDATE whatever the number of messages), and how long appends
and compactions take.

``--check`` runs the context invariants (tests/invariants.py) after every step, treats a
context larger than the full history as a violation, and stops at the first violation with
exit status 1, naming the conversation and the step. In any case every summarizer call
(prompt with its length budget, model, budget), every compaction's summary metadata (prompt
version and hash, model sent, covered range, previous version) and every ``no_gain`` skip
(the summary really was not smaller; a range is not sent twice) are checked. Exit status 0
means every step held.

    python bench/replay.py [--check] [--limit N] [--files NAME ...] [--data-dir DIR]
                           [--database-url [URL]] [--output PATH]

By default the database is a throwaway SQLite file in a temporary directory. With
``--database-url`` (alone: $DATABASE_URL) it runs on that database instead, which it
migrates and writes to: give it a database of its own.

The functions are importable (tests/test_replay.py replays a subset through them); they
import Django models lazily, so importing this module does not configure Django.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import hashlib
import json
import multiprocessing
import os
import platform
import queue as queue_module
import re
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT.parent / "shared" / "data"
DATA_FILES = ("agent_trajectories.jsonl.gz", "long_chats.jsonl.gz")
TIKTOKEN_DIR = REPO_ROOT.parent / "shared" / "tiktoken"
RESULTS_DIR = REPO_ROOT / "bench" / "results"
INVARIANTS_FILE = REPO_ROOT / "tests" / "invariants.py"

OFFLINE_SUMMARIZER = "ctxsum.summarizers.offline.OfflineSummarizer"
TRIGGER = {"messages": 12}
KEEP = {"messages": 6}
LEADING_ROLES = ("system", "developer")
# Token reduction is reported over the steps from this turn on (turn = messages appended).
REDUCTION_FROM_TURN = 20
# Sizes of the one-shot compactions that show the query count does not grow with the
# number of messages archived.
PROBE_SIZES = (4, 16, 64, 128, 192)
PROGRESS_SECONDS = 5.0
BENCH_USER = "ctxsum-bench"  # + run id + job: each run's rows are its own
FROM_ENVIRONMENT = "$DATABASE_URL"
SQLITE_FAST = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"

# What the engine must append to PROMPT for a compaction asked to fit in ``tokens``.
LENGTH_BUDGET = "Keep the summary under {tokens} tokens (about {words} words)."
COMPACTED = "compacted"
NO_GAIN = "no_gain"

MESSAGE_UPDATE = re.compile(r"""^\s*UPDATE\s+[`"]?ctxsum_message[`"]?\s""", re.IGNORECASE)

Checker = Callable[..., Any]


class ReplayViolation(AssertionError):
    """A step of the replay broke an invariant (or raised): which conversation, which step."""

    def __init__(self, conversation_id: str, step: int, problem: str) -> None:
        super().__init__(f"conversation {conversation_id} step {step}: {problem}")
        self.conversation_id = conversation_id
        self.step = step
        self.problem = problem


# --------------------------------------------------------------------------- data


def iter_records(
    data_dir: Path = DATA_DIR,
    files: Sequence[str] = DATA_FILES,
    *,
    limit: int | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file name, record)`` for every conversation, file by file in order; ``limit``
    caps the conversations taken from each file."""
    for name in files:
        path = Path(data_dir) / name
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as lines:
            taken = 0
            for line in lines:
                if not line.strip():
                    continue
                if limit is not None and taken >= limit:
                    break
                taken += 1
                yield name, json.loads(line)


def has_leading(messages: Sequence[Mapping[str, Any]]) -> bool:
    return bool(messages) and messages[0].get("role") in LEADING_ROLES


# --------------------------------------------------------------------------- checks


def invariant_checker() -> tuple[Checker, str]:
    """The invariant check shared with the test suite: tests/invariants.py (one
    implementation for both), and where it came from."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from tests.invariants import assert_context_invariants

    return assert_context_invariants, str(INVARIANTS_FILE.relative_to(REPO_ROOT))


@dataclass(frozen=True)
class SummarizerCall:
    """What ``conversation_compact`` sent the summarizer in one call, and what came back."""

    prompt: str
    model: str
    budget: int
    text: str


@contextmanager
def summarizer_calls() -> Iterator[list[SummarizerCall]]:
    """Record every call to the configured summarizer inside the block (the backend
    instance ``get_summarizer()`` hands out, wrapped for the block's duration; blocks
    nest)."""
    from ctxsum.summarizers import get_summarizer

    summarizer = get_summarizer()
    calls: list[SummarizerCall] = []
    original = summarizer.summarize

    def summarize(*, prompt: str, history: str, model: str, budget: int) -> str:
        text = original(prompt=prompt, history=history, model=model, budget=budget)
        calls.append(SummarizerCall(prompt=prompt, model=model, budget=budget, text=text))
        return text

    wrapped = vars(summarizer).get("summarize")  # an outer block's wrapper, if any
    summarizer.summarize = summarize  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        if wrapped is None:
            del summarizer.summarize
        else:
            summarizer.summarize = wrapped  # type: ignore[method-assign]


def expected_model(conversation: Any) -> str:
    """The model a summary of ``conversation`` must be written with (and stored under):
    SUMMARY_MODEL, else the conversation's chat model, else DEFAULT_MODEL."""
    from ctxsum.conf import ctxsum_settings

    return ctxsum_settings.SUMMARY_MODEL or conversation.model or ctxsum_settings.DEFAULT_MODEL


def expected_prompt(budget: int) -> str:
    from ctxsum.conf import ctxsum_settings

    budget_line = LENGTH_BUDGET.format(tokens=budget, words=budget * 3 // 4)
    return f"{ctxsum_settings.PROMPT}\n\n{budget_line}"


def call_problems(result: Any, calls: Sequence[SummarizerCall]) -> list[str]:
    """What is wrong with the summarizer calls of a compaction that reached the summarizer:
    each sent PROMPT plus the plan's length budget, the expected model, and that budget."""
    if not calls:
        return ["the summarizer was not called"]
    budget = result.plan.summary_budget if result.plan is not None else None
    model = expected_model(result.context.conversation)
    problems = []
    for call in calls:
        if call.budget != budget:
            problems.append(f"summarizer asked for {call.budget} tokens, the plan says {budget}")
        if call.prompt != expected_prompt(call.budget):
            problems.append("the prompt sent is not PROMPT + the length budget line")
        if call.model != model:
            problems.append(f"summarizer called with model {call.model!r}, expected {model!r}")
    return problems


def replaced_tokens(result: Any, version_before: Any) -> int:
    """Tokens the compaction would replace: the archived messages and the summary that was
    active before it (``version_before``, None when there was none)."""
    archived = sum(row.token_count for row in result.archived or ())
    return archived + (version_before.token_count if version_before is not None else 0)


def summary_size(text: str, conversation: Any) -> int:
    """Tokens of ``text`` as the summary message of the context."""
    from ctxsum import tokens
    from ctxsum.selectors import summary_message

    return tokens.count_message(summary_message(text), model=conversation.model or None)


def summary_problems(
    result: Any,
    *,
    version: int,
    leading: bool,
    calls: Sequence[SummarizerCall] | None = None,
    previous_summary: Any = None,
) -> list[str]:
    """What is wrong with the summary a compaction left (empty when nothing is).

    Version ``version``, the prompt version and the SHA-256 of PROMPT (the setting, not the
    prompt sent with its length budget), the model sent to the summarizer, a range that
    ends at the newest archived message and starts where the first summary started,
    ``previous`` pointing at version N-1 (now inactive), exactly the archived messages
    linked to it, a size below what it replaced, and, with ``calls`` (what the summarizer
    was sent), the prompt, model and budget of every call and the text of the last.
    """
    from ctxsum.conf import ctxsum_settings
    from ctxsum.models import CompactionAttempt, Message, Summary

    if result.summary is None:
        return ["compacted without a summary"]
    summary = Summary.objects.select_related("previous").get(pk=result.summary.pk)
    archived = [row.seq for row in result.archived or ()]
    problems = []
    if summary.version != version:
        problems.append(f"summary version {summary.version}, expected {version}")
    if not summary.prompt_version or summary.prompt_version != ctxsum_settings.PROMPT_VERSION:
        problems.append(f"prompt_version {summary.prompt_version!r}")
    prompt_hash = hashlib.sha256(ctxsum_settings.PROMPT.encode()).hexdigest()
    if summary.prompt_sha256 != prompt_hash:
        problems.append(f"prompt_sha256 {summary.prompt_sha256!r} is not the prompt's hash")
    model = expected_model(result.context.conversation)
    if not summary.model or summary.model != model:
        problems.append(f"model {summary.model!r}, the summary is written with {model!r}")
    if calls is not None:
        problems += call_problems(result, calls)
        if calls and calls[-1].model != summary.model:
            problems.append(f"stored model {summary.model!r}, sent {calls[-1].model!r}")
        if calls and calls[-1].text.strip() != summary.text:
            problems.append("the stored text is not the summarizer's answer")
    if not summary.text.strip():
        problems.append("blank summary text")
    if not summary.active:
        problems.append("new summary is not active")
    conversation = result.context.conversation
    if summary.token_count != summary_size(summary.text, conversation):
        problems.append(f"summary token_count {summary.token_count} is not its size")
    replaced = replaced_tokens(result, previous_summary)
    if summary.token_count >= replaced:
        problems.append(
            f"a {summary.token_count}-token summary replaced only {replaced} tokens (no gain)"
        )
    if not archived:
        return [*problems, "compacted but archived nothing"]
    if archived != list(range(archived[0], archived[0] + len(archived))):
        problems.append(f"archived seqs not contiguous: {archived}")
    if summary.to_seq != archived[-1]:
        problems.append(f"to_seq {summary.to_seq}, newest archived is {archived[-1]}")
    previous = summary.previous
    if version == 1:
        if previous is not None:
            problems.append("version 1 has a previous summary")
        if summary.from_seq != int(leading) or archived[0] != int(leading):
            problems.append(
                f"version 1 covers from {summary.from_seq}, archived from "
                f"{archived[0]}; the history starts at {int(leading)}"
            )
    elif previous is None:
        problems.append(f"version {version} has no previous summary")
    else:
        if previous.version != version - 1:
            problems.append(f"previous is version {previous.version}, expected {version - 1}")
        if previous.active:
            problems.append("previous summary still active")
        if summary.from_seq != previous.from_seq:
            problems.append(f"from_seq {summary.from_seq} != previous {previous.from_seq}")
        if archived[0] != previous.to_seq + 1:
            problems.append(f"archived from {archived[0]}, previous ended at {previous.to_seq}")
    linked = sorted(Message.objects.filter(summary=summary).values_list("seq", flat=True))
    if linked != archived:
        problems.append(f"messages linked to the summary {linked} != archived {archived}")
    attempt = result.attempt
    if (
        attempt is None
        or attempt.outcome != CompactionAttempt.Outcome.COMPACTED
        or attempt.summary_id != summary.pk
        or attempt.messages_archived != len(archived)
    ):
        problems.append("no matching 'compacted' attempt record")
    return problems


def no_gain_problems(
    result: Any,
    *,
    calls: Sequence[SummarizerCall],
    rejected: dict[int, int],
    previous_summary: Any,
) -> list[str]:
    """What is wrong with a ``no_gain`` skip (empty when nothing is): a skipped attempt
    recording the range; when the summarizer was called, a summary really not smaller than
    the archived messages plus the previous summary, for a range not rejected before
    (``rejected``: from_seq -> the furthest to_seq rejected, updated here); when it was
    not, a range already rejected. Nothing was written either way."""
    from ctxsum.models import CompactionAttempt, Summary

    archived = [row.seq for row in result.archived or ()]
    if not archived:
        return ["no_gain without a range"]
    first, last = archived[0], archived[-1]
    problems = []
    attempt = result.attempt
    if (
        attempt is None
        or attempt.outcome != CompactionAttempt.Outcome.SKIPPED
        or attempt.reason != NO_GAIN
        or (attempt.from_seq, attempt.to_seq) != (first, last)
        or attempt.summary_id is not None
    ):
        problems.append(f"no skipped 'no_gain' attempt recording {first}..{last}")
    if result.summary is not None:
        problems.append("no_gain returned a summary")
    conversation = result.context.conversation
    active = Summary.objects.filter(conversation=conversation, active=True).first()
    if (active and active.pk) != (previous_summary and previous_summary.pk):
        problems.append("no_gain changed the active summary")
    seen = rejected.get(first, -1)
    if calls:
        problems += call_problems(result, calls)
        if last <= seen:
            problems.append(f"{first}..{last} sent again after no_gain up to {seen}")
        size = summary_size(calls[-1].text.strip(), conversation)
        replaced = replaced_tokens(result, previous_summary)
        if size < replaced:
            problems.append(f"a {size}-token summary of {replaced} tokens skipped as no_gain")
        rejected[first] = max(seen, last)
    elif last > seen:
        problems.append(f"{first}..{last} skipped as no_gain without a summarizer call")
    return problems


def compaction_kind(*, version: int, archived: Sequence[Any], calls: Sequence[Any]) -> str:
    """What decides which statements a compaction runs, not how many messages it archives:
    a first summary or a later one (which deactivates its predecessor), whether the
    archived range holds tool calls (one EXISTS for results that arrived meanwhile), and
    summarizer calls past the first (one lease renewal each)."""
    kind = "first" if version == 1 else "later"
    if any(row.tool_calls for row in archived):
        kind += ", tool calls archived"
    if len(calls) > 1:
        kind += f", {len(calls)} summarizer calls"
    return kind


def message_updates(queries: Sequence[Mapping[str, Any]]) -> int:
    """How many of the captured queries are UPDATEs of ctxsum_message."""
    return sum(1 for query in queries if MESSAGE_UPDATE.match(query["sql"]))


# --------------------------------------------------------------------------- stats


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Sequence[float], *, scale: float = 1.0, digits: int = 4):
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": round(min(values) * scale, digits),
        "median": round(percentile(values, 50) * scale, digits),
        "mean": round(sum(values) / len(values) * scale, digits),
        "p95": round(percentile(values, 95) * scale, digits),
        "max": round(max(values) * scale, digits),
    }


@dataclass
class ReplayStats:
    conversations: int = 0
    messages: int = 0
    compactions: int = 0
    per_file: dict[str, Counter] = field(default_factory=dict)
    # Every compact call by its reason (compacted, below_trigger, no_gain, ...).
    reasons: Counter = field(default_factory=Counter)
    # Compact calls whose context still reached the trigger afterwards, by reason.
    over_trigger: Counter = field(default_factory=Counter)
    # no_gain skips: after a summarizer call whose summary was not smaller / without a call
    # (the same range, or a shorter one from the same start, was rejected before).
    no_gain_summarized: int = 0
    no_gain_not_sent: int = 0
    summarizer_calls: int = 0
    summary_budgets: list[int] = field(default_factory=list)
    # Tokens of each committed summary as a context message / of what it replaced.
    summary_ratios: list[float] = field(default_factory=list)
    # 1 - context tokens / full history tokens, at every step from REDUCTION_FROM_TURN on.
    reductions: list[float] = field(default_factory=list)
    final_reductions: list[float] = field(default_factory=list)
    reductions_by_file: dict[str, list[float]] = field(default_factory=dict)
    archived: list[int] = field(default_factory=list)
    compaction_queries: list[int] = field(default_factory=list)
    compaction_message_updates: list[int] = field(default_factory=list)
    queries_by_archived: dict[int, Counter] = field(default_factory=dict)
    # By what changes the statements a compaction runs (see compaction_kind).
    queries_by_kind: dict[str, Counter] = field(default_factory=dict)
    # Compact calls that compacted nothing: queries and seconds, by reason.
    skipped_queries: dict[str, Counter] = field(default_factory=dict)
    skipped_seconds: dict[str, list[float]] = field(default_factory=dict)
    append_queries: Counter = field(default_factory=Counter)
    append_seconds: list[float] = field(default_factory=list)
    compaction_seconds: list[float] = field(default_factory=list)
    check_seconds: float = 0.0
    max_active_messages: int = 0
    # Steps whose context costs more than sending the whole history would (all turns).
    context_over_history: int = 0

    def merge(self, other: ReplayStats) -> None:
        """Add ``other`` (another job's shard) into this one."""
        for name in (
            "conversations",
            "messages",
            "compactions",
            "no_gain_summarized",
            "no_gain_not_sent",
            "summarizer_calls",
            "check_seconds",
            "context_over_history",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_active_messages = max(self.max_active_messages, other.max_active_messages)
        for name in ("reasons", "over_trigger", "append_queries"):
            getattr(self, name).update(getattr(other, name))
        for name in ("reductions_by_file", "skipped_seconds"):
            mine = getattr(self, name)
            for key, values in getattr(other, name).items():
                mine.setdefault(key, []).extend(values)
        for name in ("per_file", "queries_by_archived", "queries_by_kind", "skipped_queries"):
            mine = getattr(self, name)
            for key, values in getattr(other, name).items():
                mine.setdefault(key, Counter()).update(values)
        for name in (
            "summary_budgets",
            "summary_ratios",
            "reductions",
            "final_reductions",
            "archived",
            "compaction_queries",
            "compaction_message_updates",
            "append_seconds",
            "compaction_seconds",
        ):
            getattr(self, name).extend(getattr(other, name))


def replay_conversation(
    record: Mapping[str, Any],
    *,
    owner: Any,
    stats: ReplayStats | None = None,
    checker: Checker | None = None,
    source: str = "",
    check_size: bool = False,
) -> Any:
    """Replay one record: create the conversation, then append each message on its own and
    call ``conversation_compact`` after each append. Raises ReplayViolation at the first
    broken step (``check_size``: a context costing more than the full history is one);
    returns the conversation."""
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    from ctxsum import tokens
    from ctxsum.services.compaction import conversation_compact
    from ctxsum.services.conversations import conversation_create
    from ctxsum.services.messages import message_append

    stats = stats if stats is not None else ReplayStats()
    record_id = str(record["id"])
    messages = list(record["messages"])
    leading = has_leading(messages)
    file_reductions = stats.reductions_by_file.setdefault(source, [])
    conversation = conversation_create(
        owner=owner,
        title=record_id[:200],
        metadata={"replay_id": record_id, "source": str(record.get("source", ""))[:200]},
        trigger=dict(TRIGGER),
        keep=dict(KEEP),
    )
    history_tokens = 0
    version = 0
    reduction = 0.0
    summary = None  # the active summary
    rejected: dict[int, int] = {}  # no_gain ranges: from_seq -> furthest to_seq
    perf = time.perf_counter
    for step, message in enumerate(messages, start=1):
        try:
            reset_queries()
            started = perf()
            with CaptureQueriesContext(connection) as captured:
                appended = message_append(conversation=conversation, messages=[message])
            finished_append = perf()
            # Read now: the capture is a slice of connection.queries, which the reset clears.
            append_queries = len(captured)
            reset_queries()
            with summarizer_calls() as calls, CaptureQueriesContext(connection) as captured:
                started_compact = perf()
                result = conversation_compact(conversation=conversation)
                finished = perf()
            compact_queries = captured.captured_queries
        except Exception as error:
            raise ReplayViolation(record_id, step, f"{type(error).__name__}: {error}") from error
        if appended.compaction is not None:
            raise ReplayViolation(
                record_id, step, "the append compacted by itself: AUTO_COMPACT must be off"
            )
        (row,) = appended.messages
        conversation = result.context.conversation
        reason = str(result.reason)
        stats.append_seconds.append(finished_append - started)
        stats.append_queries[append_queries] += 1
        stats.reasons[reason] += 1
        stats.over_trigger[reason] += bool(result.over_trigger)
        stats.summarizer_calls += len(calls)

        if result.compacted:
            version += 1
            archived = len(result.archived or ())
            queries = len(compact_queries)
            stats.compactions += 1
            stats.archived.append(archived)
            stats.compaction_seconds.append(finished - started_compact)
            stats.compaction_queries.append(queries)
            stats.compaction_message_updates.append(message_updates(compact_queries))
            stats.queries_by_archived.setdefault(archived, Counter())[queries] += 1
            kind = compaction_kind(version=version, archived=result.archived, calls=calls)
            stats.queries_by_kind.setdefault(kind, Counter())[queries] += 1
            problems = summary_problems(
                result, version=version, leading=leading, calls=calls, previous_summary=summary
            )
            if problems:
                raise ReplayViolation(record_id, step, "; ".join(problems))
            stats.summary_budgets.append(result.plan.summary_budget)
            stats.summary_ratios.append(
                result.summary.token_count / replaced_tokens(result, summary)
            )
            summary = result.summary
        else:
            stats.skipped_seconds.setdefault(reason, []).append(finished - started_compact)
            stats.skipped_queries.setdefault(reason, Counter())[len(compact_queries)] += 1
            if reason == NO_GAIN:
                problems = no_gain_problems(
                    result, calls=calls, rejected=rejected, previous_summary=summary
                )
                if problems:
                    raise ReplayViolation(record_id, step, "no_gain: " + "; ".join(problems))
                if calls:
                    stats.no_gain_summarized += 1
                else:
                    stats.no_gain_not_sent += 1
            elif calls:
                raise ReplayViolation(
                    record_id, step, f"{reason}, yet the summarizer was called {len(calls)} times"
                )

        # The context as it would be sent, against sending every original message so far.
        history_tokens += row.token_count
        full = tokens.context_tokens([history_tokens])
        sent = result.context.token_count
        if sent != tokens.context_tokens([conversation.active_tokens]):
            raise ReplayViolation(
                record_id,
                step,
                f"context costs {sent} tokens, the counter says "
                f"{tokens.context_tokens([conversation.active_tokens])}",
            )
        reduction = 1 - sent / full
        stats.context_over_history += sent > full
        if check_size and sent > full:
            raise ReplayViolation(
                record_id,
                step,
                f"the context costs {sent} tokens, more than the {full} of the full history",
            )
        if step >= REDUCTION_FROM_TURN:
            stats.reductions.append(reduction)
            file_reductions.append(reduction)
        stats.max_active_messages = max(stats.max_active_messages, len(result.context.messages))

        if checker is not None:
            checked = perf()
            try:
                checker(conversation, original_messages=messages[:step])
            except AssertionError as error:
                raise ReplayViolation(record_id, step, f"invariant: {error}") from error
            stats.check_seconds += perf() - checked
        stats.messages += 1
    per_file = stats.per_file.setdefault(source, Counter())
    per_file.update(conversations=1, messages=len(messages), compactions=version)
    stats.conversations += 1
    stats.final_reductions.append(reduction)
    return conversation


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
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    from ctxsum.services.compaction import conversation_compact
    from ctxsum.services.conversations import conversation_create

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
        reset_queries()
        with summarizer_calls() as calls, CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            result = conversation_compact(conversation=conversation, force=True)
            seconds = time.perf_counter() - started
        label = f"probe {size} of {record['id']}"
        if not result.compacted:
            raise ReplayViolation(label, total, f"did not compact: {result.reason}")
        problems = summary_problems(result, version=1, leading=leading, calls=calls)
        if problems:
            raise ReplayViolation(label, total, "; ".join(problems))
        if checker is not None:
            try:
                checker(result.context.conversation, original_messages=messages[:total])
            except AssertionError as error:
                raise ReplayViolation(label, total, f"invariant: {error}") from error
        rows.append(
            {
                "archived": len(result.archived or ()),
                "queries": len(captured),
                "message_updates": message_updates(captured.captured_queries),
                "kind": compaction_kind(version=1, archived=result.archived, calls=calls),
                "summarizer_calls": len(calls),
                "summarizer_input_tokens": result.summary.input_tokens,
                "summary_budget": result.plan.summary_budget,
                "summary_tokens": result.summary.token_count,
                "ms": round(seconds * 1000, 2),
            }
        )
    return rows


# --------------------------------------------------------------------------- report


def build_report(stats: ReplayStats) -> dict[str, Any]:
    def counter(values: Counter) -> dict[str, int]:
        return {str(key): values[key] for key in sorted(values)}

    def spread(values: Counter) -> dict[str, Any]:
        keys = sorted(values)
        if not keys:
            return {"n": 0}
        flat = [key for key in keys for _ in range(values[key])]
        return {
            "n": len(flat),
            "min": keys[0],
            "median": percentile(flat, 50),
            "max": keys[-1],
            "histogram": counter(values),
        }

    def with_p5(values: Sequence[float]) -> dict[str, Any]:
        return {
            **distribution(values),
            "p5": round(percentile(values, 5), 4) if values else None,
        }

    return {
        "conversations": stats.conversations,
        "messages": stats.messages,
        "compactions": stats.compactions,
        "files": {name: dict(values) for name, values in stats.per_file.items()},
        "compaction_calls": counter(stats.reasons),
        "no_gain_skips": stats.reasons[NO_GAIN],
        "no_gain": {
            "skips": stats.reasons[NO_GAIN],
            "after_a_summarizer_call": stats.no_gain_summarized,
            "range_rejected_before_not_sent": stats.no_gain_not_sent,
        },
        "compactions_over_trigger": stats.over_trigger[COMPACTED],
        "compact_calls_over_trigger": counter(+stats.over_trigger),
        "summarizer_calls": stats.summarizer_calls,
        "summary_budget": distribution(stats.summary_budgets, digits=1),
        "summary_to_replaced_tokens": distribution(stats.summary_ratios),
        "archived_per_compaction": distribution(stats.archived, digits=2),
        "max_context_messages": stats.max_active_messages,
        "token_reduction": {
            "from_turn": REDUCTION_FROM_TURN,
            "definition": "1 - active context tokens / tokens of every original message so far "
            "(both as one request: per-message overhead and reply priming included)",
            **with_p5(stats.reductions),
        },
        "token_reduction_by_file": {
            name: with_p5(values) for name, values in sorted(stats.reductions_by_file.items())
        },
        "steps_with_context_over_full_history": stats.context_over_history,
        "final_token_reduction": with_p5(stats.final_reductions),
        "queries_per_compaction": {
            **distribution(stats.compaction_queries, digits=2),
            "by_kind": {
                key: counter(value) for key, value in sorted(stats.queries_by_kind.items())
            },
            "by_messages_archived": {
                str(archived): counter(values)
                for archived, values in sorted(stats.queries_by_archived.items())
            },
        },
        "message_updates_per_compaction": counter(Counter(stats.compaction_message_updates)),
        "queries_per_skipped_compact_call": {
            reason: spread(values) for reason, values in sorted(stats.skipped_queries.items())
        },
        "queries_per_append": spread(stats.append_queries),
        "timings_ms": {
            "append": distribution(stats.append_seconds, scale=1000, digits=3),
            "compaction": distribution(stats.compaction_seconds, scale=1000, digits=3),
            "skipped_compact_call": {
                reason: distribution(values, scale=1000, digits=3)
                for reason, values in sorted(stats.skipped_seconds.items())
            },
            "invariant_checks_total_s": round(stats.check_seconds, 2),
        },
    }


def format_report(report: Mapping[str, Any]) -> str:
    reduction = report["token_reduction"]
    queries = report["queries_per_compaction"]
    timings = report["timings_ms"]
    archived = report["archived_per_compaction"]
    no_gain = report["no_gain"]
    budget = report["summary_budget"]
    ratio = report["summary_to_replaced_tokens"]
    skipped = {
        reason: values.get("histogram")
        for reason, values in report["queries_per_skipped_compact_call"].items()
    }
    lines = [
        f"ctxsum replay {report['date']}  ({report['database']['vendor']} "
        f"{report['database']['version']}, {report['machine']['cpus']} CPUs, "
        f"check={'on' if report['check'] else 'off'})",
        f"  policy: trigger {report['policy']['trigger']}, keep {report['policy']['keep']}, "
        f"summarizer {report['policy']['summarizer'].rsplit('.', 1)[-1]}",
        f"  conversations {report['conversations']}, messages {report['messages']}, "
        f"compactions {report['compactions']}, summaries {report['summaries']}",
        f"  compact calls by reason: {report['compaction_calls']}",
        f"  no_gain skips: {no_gain['skips']} ({no_gain['after_a_summarizer_call']} after a "
        f"summarizer call, {no_gain['range_rejected_before_not_sent']} not sent again); "
        f"summarizer calls {report['summarizer_calls']}",
        f"  compactions that ended over the trigger: {report['compactions_over_trigger']}; "
        f"compact calls over the trigger by reason: {report['compact_calls_over_trigger']}",
        f"  summary budget (tokens): median {budget.get('median')}, min {budget.get('min')}, "
        f"max {budget.get('max')}; summary / replaced tokens: median {ratio.get('median')}, "
        f"p95 {ratio.get('p95')}, max {ratio.get('max')}",
        f"  messages archived per compaction: median {archived.get('median')}, max "
        f"{archived.get('max')}; largest context sent: "
        f"{report['max_context_messages']} messages",
        f"  token reduction at turn >= {reduction['from_turn']} ({reduction['n']} steps): "
        f"median {reduction.get('median')}, p95 {reduction.get('p95')}, "
        f"p5 {reduction.get('p5')}, mean {reduction.get('mean')}",
    ]
    lines += [
        f"    {name or 'all'}: median {values.get('median')}, p95 {values.get('p95')}, "
        f"p5 {values.get('p5')} ({values['n']} steps)"
        for name, values in report["token_reduction_by_file"].items()
    ]
    lines += [
        f"  steps (any turn) whose context costs more than the full history: "
        f"{report['steps_with_context_over_full_history']}",
        f"  queries per compaction: min {queries.get('min')}, median {queries.get('median')}, "
        f"max {queries.get('max')}; by kind: {queries['by_kind']}",
        f"  queries per compaction by messages archived: {queries['by_messages_archived']}",
        f"  UPDATEs of ctxsum_message per compaction: {report['message_updates_per_compaction']}",
        f"  queries per compact call that compacted nothing, by reason: {skipped}",
        f"  queries per append: {report['queries_per_append'].get('histogram')}",
    ]
    for row in report.get("query_scaling", []):
        lines.append(
            f"  one-shot compaction archiving {row['archived']:>4} messages: {row['queries']} "
            f"queries ({row['kind']}), {row['message_updates']} UPDATE of ctxsum_message, "
            f"{row['ms']} ms"
        )
    rows = [(name, timings[name]) for name in ("append", "compaction")]
    rows += [
        (f"compact call ({reason})", value)
        for reason, value in timings["skipped_compact_call"].items()
    ]
    for name, value in rows:
        lines.append(
            f"  {name} ms: median {value.get('median')}, mean {value.get('mean')}, "
            f"p95 {value.get('p95')}, max {value.get('max')} (n={value['n']})"
        )
    lines.append(
        f"  wall {report['wall_seconds']} s (replay {report['replay_seconds']} s, "
        f"invariant checks {timings['invariant_checks_total_s']} s, setup+migrate "
        f"{report['setup_seconds']} s); process CPU {report['cpu_seconds']} s; load average "
        f"{report['load_average_at_start']} at start, {report['load_average_at_end']} at end"
    )
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def git_info() -> dict[str, Any]:
    """The commit the replay ran on, and whether the working tree had changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "ctxsum"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "ctxsum_changed": None}
    return {"commit": commit, "ctxsum_changed": bool(status.strip())}


def database_info() -> dict[str, Any]:
    from django.db import connection

    connection.ensure_connection()
    if connection.vendor == "sqlite":
        version = connection.Database.sqlite_version
    elif connection.vendor == "postgresql":
        number = connection.pg_version
        version = f"{number // 10000}.{number % 10000}"
    else:
        version = "?"
    return {"vendor": connection.vendor, "version": version}


# --------------------------------------------------------------------------- main


def setup_django(
    *, database_url: str | None, sqlite_dir: Path, sqlite_fsync: bool = False, migrate: bool = True
) -> None:
    """Configure Django for the replay: the example project's settings, the given database
    (else a new SQLite file in ``sqlite_dir``), the offline summarizer; then migrate.

    The throwaway SQLite file runs in WAL mode with synchronous=NORMAL (no fsync per
    commit) unless ``sqlite_fsync``: SQLite's defaults cost an fsync per transaction, which
    on this machine's disk is ~20 ms and would measure the disk, not ctxsum."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    if "TIKTOKEN_CACHE_DIR" not in os.environ and TIKTOKEN_DIR.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_DIR)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

    import django
    from django.conf import settings

    if database_url:
        import environ

        database = environ.Env.db_url_config(database_url)
    else:
        sqlite_dir.mkdir(parents=True, exist_ok=True)
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(sqlite_dir / "replay.db")}
        if not sqlite_fsync:
            database["OPTIONS"] = {"init_command": SQLITE_FAST}
    settings.DATABASES = {"default": database}
    # DEBUG would keep every query in memory; the replay captures the ones it counts.
    settings.DEBUG = False
    # The replay compacts after every append itself: no automatic compaction on top.
    settings.CTXSUM = {
        **(getattr(settings, "CTXSUM", None) or {}),
        "SUMMARIZER": OFFLINE_SUMMARIZER,
        "AUTO_COMPACT": False,
    }
    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


@dataclass(frozen=True)
class Job:
    """One shard of the replay: every ``jobs``-th conversation, from the ``index``-th on."""

    index: int
    jobs: int
    data_dir: Path
    files: tuple[str, ...]
    limit: int | None
    check: bool
    owner: str
    database_url: str | None = None
    sqlite_dir: Path | None = None
    sqlite_fsync: bool = False


@dataclass
class JobResult:
    index: int
    stats: ReplayStats | None = None
    summaries: int = 0
    cpu_seconds: float = 0.0
    violation: str | None = None


def replay_job(job: Job, progress: Callable[[ReplayStats], None] | None = None) -> JobResult:
    """Replay the job's shard (Django is set up). A violation ends it, reported in the
    result."""
    from django.contrib.auth import get_user_model

    from ctxsum.models import Summary

    owner, _ = get_user_model().objects.get_or_create(username=job.owner)
    checker = invariant_checker()[0] if job.check else None
    stats = ReplayStats()
    result = JobResult(job.index, stats)
    records = iter_records(job.data_dir, job.files, limit=job.limit)
    try:
        for position, (source, record) in enumerate(records):
            if position % job.jobs != job.index:
                continue
            replay_conversation(
                record,
                owner=owner,
                stats=stats,
                checker=checker,
                source=source,
                check_size=job.check,
            )
            if progress is not None:
                progress(stats)
    except ReplayViolation as violation:
        result.violation = str(violation)
    result.summaries = Summary.objects.filter(conversation__owner=owner).count()
    result.cpu_seconds = time.process_time()
    return result


def _job_process(job: Job, queue: Any) -> None:
    """The body of a worker process: its own Django, its own SQLite file (or the shared
    database), its shard; progress and the result go back through ``queue``."""
    try:
        setup_django(
            database_url=job.database_url,
            sqlite_dir=(job.sqlite_dir or Path(tempfile.gettempdir())) / f"job-{job.index}",
            sqlite_fsync=job.sqlite_fsync,
            migrate=job.database_url is None,  # a shared database was migrated by the parent
        )

        def progress(stats: ReplayStats) -> None:
            queue.put(
                ("progress", job.index, stats.conversations, stats.messages, stats.compactions)
            )

        queue.put(("done", replay_job(job, progress)))
    except BaseException:
        queue.put(("error", job.index, traceback.format_exc()))
        raise
    finally:
        from django.db import connections

        connections.close_all()


def run_jobs(jobs: Sequence[Job], total: int) -> list[JobResult]:
    """Run the jobs: in this process when there is one, else one spawned process each.
    Stops every job at the first violation."""
    progress = Progress(total)
    if len(jobs) == 1:
        result = replay_job(
            jobs[0],
            lambda stats: progress.update(stats.conversations, stats.messages, stats.compactions),
        )
        progress.update(
            result.stats.conversations, result.stats.messages, result.stats.compactions, force=True
        )
        return [result]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_job_process, args=(job, queue)) for job in jobs]
    for process in processes:
        process.start()
    counts = {job.index: (0, 0, 0) for job in jobs}
    results: list[JobResult] = []
    try:
        while len(results) < len(jobs):
            try:
                message = queue.get(timeout=1.0)
            except queue_module.Empty:
                if any(p.exitcode not in (None, 0) for p in processes):
                    raise RuntimeError("a replay job died; see its traceback above") from None
                continue
            if message[0] == "progress":
                counts[message[1]] = message[2:]
                progress.update(*(sum(values) for values in zip(*counts.values(), strict=True)))
            elif message[0] == "error":
                raise RuntimeError(f"replay job {message[1]} failed:\n{message[2]}")
            else:
                result = message[1]
                results.append(result)
                if result.violation:
                    break
    finally:
        if len(results) < len(jobs) or any(result.violation for result in results):
            for process in processes:
                if process.is_alive():
                    process.terminate()
        for process in processes:
            process.join()
    done = [result.stats for result in results if result.stats is not None]
    progress.update(
        sum(s.conversations for s in done),
        sum(s.messages for s in done),
        sum(s.compactions for s in done),
        force=True,
    )
    return sorted(results, key=lambda result: result.index)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Replay the real conversations through ctxsum, compacting after every "
        "append, and report token reduction, queries per compaction and timings."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="check the context invariants after every step, and that no context costs more "
        "than the full history; exit 1 on the first violation",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DATA_DIR,
        help=f"directory of the JSONL files (default: {DATA_DIR})",
    )
    parser.add_argument(
        "--files",
        nargs="+",
        default=list(DATA_FILES),
        metavar="NAME",
        help="files of the data directory to replay (default: both)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="replay at most N conversations of each file",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="replay in N processes, each with its own SQLite file (or all on "
        "the --database-url database); default: the number of CPUs",
    )
    parser.add_argument(
        "--database-url",
        nargs="?",
        const=FROM_ENVIRONMENT,
        default=None,
        metavar="URL",
        help="run on this database instead of throwaway SQLite files; "
        "alone, use $DATABASE_URL. It is migrated and written to.",
    )
    parser.add_argument(
        "--sqlite-fsync",
        action="store_true",
        help="keep SQLite's default journal and synchronous=FULL (an fsync "
        "per commit) instead of WAL with synchronous=NORMAL",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="PATH",
        help="JSON results file (default: bench/results/replay-<date>.json, "
        "with the vendor appended when not SQLite)",
    )
    parser.add_argument(
        "--no-probe", action="store_true", help="skip the one-shot compactions of growing size"
    )
    args = parser.parse_args(argv)
    if args.database_url == FROM_ENVIRONMENT:
        args.database_url = os.environ.get("DATABASE_URL")
        if not args.database_url:
            parser.error("--database-url without a URL needs $DATABASE_URL")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


class Progress:
    """A line on stderr every few seconds."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.started = time.monotonic()
        self.shown = self.started

    def update(
        self, conversations: int, messages: int, compactions: int, *, force: bool = False
    ) -> None:
        now = time.monotonic()
        if not force and now - self.shown < PROGRESS_SECONDS:
            return
        self.shown = now
        elapsed = now - self.started
        rate = messages / elapsed if elapsed else 0.0
        print(
            f"[replay] {conversations}/{self.total} conversations, {messages} messages, "
            f"{compactions} compactions, {elapsed:.0f} s ({rate:.0f} messages/s)",
            file=sys.stderr,
            flush=True,
        )


def fail(message: str) -> int:
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    print(f"FAIL: {message}", flush=True)
    return 1


def run(args: argparse.Namespace, *, sqlite_dir: Path, started: float) -> int:
    from django.contrib.auth import get_user_model

    from ctxsum.conf import ctxsum_settings

    setup_seconds = time.perf_counter() - started
    git = git_info()  # at the start: the code the jobs import, not what HEAD is at the end
    load_at_start = [round(value, 2) for value in os.getloadavg()]
    records = [record for _, record in iter_records(args.data_dir, args.files, limit=args.limit)]
    run_id = uuid.uuid4().hex[:8]
    jobs = [
        Job(
            index=index,
            jobs=min(args.jobs, max(len(records), 1)),
            data_dir=args.data_dir,
            files=tuple(args.files),
            limit=args.limit,
            check=args.check,
            owner=f"{BENCH_USER}-{run_id}-{index}",
            database_url=args.database_url,
            sqlite_dir=sqlite_dir,
            sqlite_fsync=args.sqlite_fsync,
        )
        for index in range(min(args.jobs, max(len(records), 1)))
    ]
    checker_source = invariant_checker()[1] if args.check else None
    print(
        f"[replay] {len(records)} conversations from {', '.join(args.files)} in "
        f"{len(jobs)} job(s); invariant checks: {checker_source or 'off'}",
        file=sys.stderr,
        flush=True,
    )
    replay_started = time.perf_counter()
    results = run_jobs(jobs, len(records))
    replay_seconds = time.perf_counter() - replay_started
    for result in results:
        if result.violation:
            return fail(result.violation)
    stats = ReplayStats()
    for result in results:
        assert result.stats is not None
        stats.merge(result.stats)
    probe: list[dict[str, Any]] = []
    if not args.no_probe and records:
        owner, _ = get_user_model().objects.get_or_create(username=f"{BENCH_USER}-{run_id}")
        longest = max(records, key=lambda record: len(record["messages"]))
        checker = invariant_checker()[0] if args.check else None
        try:
            probe = query_scaling(longest, owner=owner, checker=checker)
        except ReplayViolation as violation:
            return fail(str(violation))

    report = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "git": git,
        "database": database_info(),
        "django": __import__("django").get_version(),
        "jobs": len(jobs),
        "check": bool(args.check),
        "invariant_checker": checker_source,
        "policy": {
            "trigger": TRIGGER,
            "keep": KEEP,
            "summarizer": OFFLINE_SUMMARIZER,
            "summary_max_tokens": ctxsum_settings.SUMMARY_MAX_TOKENS,
            "summary_model": ctxsum_settings.SUMMARY_MODEL,
            "target_ratio": ctxsum_settings.TARGET_RATIO,
            "chat_model": ctxsum_settings.DEFAULT_MODEL,
        },
        **build_report(stats),
        "summaries": sum(result.summaries for result in results),
        "query_scaling": probe,
        "load_average_at_start": load_at_start,
        "load_average_at_end": [round(value, 2) for value in os.getloadavg()],
        "cpu_seconds": round(
            time.process_time()
            + (sum(result.cpu_seconds for result in results) if len(jobs) > 1 else 0),
            2,
        ),
        "setup_seconds": round(setup_seconds, 2),
        "replay_seconds": round(replay_seconds, 2),
        "wall_seconds": round(time.perf_counter() - started, 2),
    }
    output = args.output
    if output is None:
        vendor = report["database"]["vendor"]
        suffix = "" if vendor == "sqlite" else f"-{vendor}"
        output = RESULTS_DIR / f"replay-{report['date'][:10]}{suffix}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(format_report(report))
    print(f"  results: {output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ctxsum-replay-") as tmp:
        sqlite_dir = Path(tmp)
        setup_django(
            database_url=args.database_url,
            sqlite_dir=sqlite_dir / "main",
            sqlite_fsync=args.sqlite_fsync,
        )
        try:
            return run(args, sqlite_dir=sqlite_dir, started=started)
        finally:
            from django.db import connections

            connections.close_all()


if __name__ == "__main__":
    sys.exit(main())
