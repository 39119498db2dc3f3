"""What a replay counts and measures, shard by shard (ReplayStats, merged across worker
processes), and the small statistics its report is made of. No Django: the parent
process merges and reports what its workers sent back."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Token reduction is reported over the steps from this turn on (turn = messages appended).
REDUCTION_FROM_TURN = 20

MESSAGE_UPDATE = re.compile(r"""^\s*UPDATE\s+[`"]?ctxsum_message[`"]?\s""", re.IGNORECASE)
SKIPS_NOTED = re.compile(
    r"""^\s*UPDATE\s+[`"]?ctxsum_summary[`"]?\s+SET\s+[`"]?facts_skipped[`"]?""", re.IGNORECASE
)
# The key facts' statements: reads of the facts, the merge's bulk writes, and the rewrite of
# which facts the context carries.
FACT_STATEMENT = re.compile(
    r"""^\s*(SELECT|INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s.*?[`"]?"""
    r"""(ctxsum_factchange|ctxsum_carriedfact|ctxsum_fact)[`"]?[\s.]""",
    re.IGNORECASE | re.DOTALL,
)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Sequence[float], *, scale: float = 1.0, digits: int = 4) -> dict[str, Any]:
    """n, min, median, mean, p95 and max of ``values`` times ``scale``, rounded."""
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


def compaction_kind(
    *,
    version: int,
    archived: Sequence[Any],
    calls: Sequence[Any],
    queries: Sequence[Mapping[str, Any]] = (),
) -> str:
    """What decides which statements a compaction runs, not how many messages it archives
    or how many key facts it merges: a first summary or a later one (which deactivates its
    predecessor), whether the archived range holds tool calls (one EXISTS for results that
    arrived meanwhile), summarizer calls past the first (one lease renewal each), and the
    key facts' statements (``facts_kind``)."""
    kind = "first" if version == 1 else "later"
    if any(row.tool_calls for row in archived):
        kind += ", tool calls archived"
    if len(calls) > 1:
        kind += f", {len(calls)} summarizer calls"
    facts = facts_kind(queries)
    return f"{kind}, {facts}" if facts else kind


def facts_kind(queries: Sequence[Mapping[str, Any]]) -> str:
    """The key facts' statements a compaction ran: how many reads of the facts block (the
    snapshot's, the merge's, the fresh context's), whether it merged (in a savepoint), and
    which bulk writes it made, each with how many statements (one however many facts it
    writes; the changed facts' update two when they differ in more than it sets on all), so
    these decide the count."""
    reads, writes, merged = 0, Counter[str](), False
    for index, query in enumerate(queries):
        match = FACT_STATEMENT.match(query["sql"])
        if match is None:
            if SKIPS_NOTED.match(query["sql"]):
                writes["skips noted"] += 1  # facts left out, said in Summary.facts_skipped
            continue
        verb, table = match.group(1).split()[0].upper(), match.group(2).lower()
        if verb == "SELECT" and table == "ctxsum_fact":
            reads += 1
            before = queries[index - 1]["sql"].lstrip().upper() if index else ""
            merged = merged or before.startswith("SAVEPOINT")
        elif verb != "SELECT":
            writes[f"{verb.lower()} {table.removeprefix('ctxsum_')}"] += 1
    if not reads and not writes:
        return ""
    done = [write if count == 1 else f"{write} {count}x" for write, count in writes.items()]
    parts = [f"facts read {reads}x", *(["merged"] if merged else []), *sorted(done)]
    return " ".join(parts)


def message_updates(queries: Sequence[Mapping[str, Any]]) -> int:
    """How many of the captured queries are UPDATEs of ctxsum_message."""
    return sum(1 for query in queries if MESSAGE_UPDATE.match(query["sql"]))


@dataclass
class ReplayStats:
    """Everything one replay (or one shard of it) counted; ``merge`` adds another shard."""

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
    checked_steps: int = 0  # steps the invariants were checked after
    max_active_messages: int = 0
    # Steps whose context costs more than sending the whole history would (all turns).
    context_over_history: int = 0
    # With --check, after its last step: conversations whose first archived message with
    # distinctive text was redacted, then compacted once more, invariant (f) checked after
    # both (tests/support/replay.py, erasure_probe).
    erasure_probes: int = 0
    erasure_probe_compactions: int = 0  # the summaries those forced compactions wrote

    # How ``merge`` combines each field (max_active_messages: the larger).
    SUMS = (
        "conversations",
        "messages",
        "compactions",
        "no_gain_summarized",
        "no_gain_not_sent",
        "summarizer_calls",
        "check_seconds",
        "checked_steps",
        "context_over_history",
        "erasure_probes",
        "erasure_probe_compactions",
    )
    COUNTERS = ("reasons", "over_trigger", "append_queries")
    LISTS_BY_KEY = ("reductions_by_file", "skipped_seconds")
    COUNTERS_BY_KEY = ("per_file", "queries_by_archived", "queries_by_kind", "skipped_queries")
    LISTS = (
        "summary_budgets",
        "summary_ratios",
        "reductions",
        "final_reductions",
        "archived",
        "compaction_queries",
        "compaction_message_updates",
        "append_seconds",
        "compaction_seconds",
    )

    def merge(self, other: ReplayStats) -> None:
        """Add ``other`` (another job's shard) into this one."""
        for name in self.SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_active_messages = max(self.max_active_messages, other.max_active_messages)
        for name in self.COUNTERS:
            getattr(self, name).update(getattr(other, name))
        for name in self.LISTS_BY_KEY:
            mine = getattr(self, name)
            for key, values in getattr(other, name).items():
                mine.setdefault(key, []).extend(values)
        for name in self.COUNTERS_BY_KEY:
            mine = getattr(self, name)
            for key, values in getattr(other, name).items():
                mine.setdefault(key, Counter()).update(values)
        for name in self.LISTS:
            getattr(self, name).extend(getattr(other, name))
