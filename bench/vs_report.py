"""The comparison's numbers: per side, tokens sent per call (all calls, from message index
20 and 50 on, with and without the system message), whether the system prompt was kept in
every call, and the total billed against the full history and the windows; per
conversation, every side's totals."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from bench.common import summary_of
from bench.vs_sides import Call, SideResult

FROM_INDEX = (0, 20, 50)


def calls_summary(calls: Sequence[Call]) -> dict[str, Any]:
    """Tokens sent per call, with and without the system message, from each index on."""
    summary: dict[str, Any] = {}
    for start in FROM_INDEX:
        chosen = [call for call in calls if call.index >= start]
        summary[f"from_index_{start}"] = {
            "with_system": summary_of([call.sent for call in chosen]),
            "without_system": summary_of([call.sent - call.system for call in chosen]),
        }
    return summary


def side_totals(results: Sequence[SideResult]) -> dict[str, Any]:
    """One side's totals over ``results`` (one per conversation)."""
    with_system = [result for result in results if result.system_kept is not None]
    reasons: dict[str, int] = {}
    for result in results:
        for reason, count in result.reasons.items():
            reasons[reason] = reasons.get(reason, 0) + count
    return {
        "conversations": len(results),
        "calls": sum(len(result.calls) for result in results),
        "sent": sum(result.sent for result in results),
        "summarizer_calls": sum(result.summarizer_calls for result in results),
        "summarizer_in": sum(result.summarizer_in for result in results),
        "summarizer_out": sum(result.summarizer_out for result in results),
        "summaries": sum(result.summaries for result in results),
        "billed": sum(result.billed for result in results),
        "conversations_with_system": len(with_system),
        "system_kept_in_every_call": sum(bool(result.system_kept) for result in with_system),
        **({"ctxsum_compact_reasons": reasons} if reasons else {}),
    }


def aggregate(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Every side's totals and per-call distributions over ``rows``, with the billed
    tokens as a fraction of the full history's and of each window's."""
    sides: dict[str, Any] = {}
    for name in names:
        results = [row["sides"][name] for row in rows]
        calls = [call for result in results for call in result.calls]
        sides[name] = {**side_totals(results), "per_call": calls_summary(calls)}
    baselines = [name for name in names if name == "full" or name.startswith("window_")]
    for name in names:
        billed = sides[name]["billed"]
        sides[name]["billed_vs"] = {
            base: round(billed / sides[base]["billed"], 4) if sides[base]["billed"] else None
            for base in baselines
        }
    return sides


def wins(rows: Iterable[dict[str, Any]], side: str, other: str) -> dict[str, int]:
    """Conversations where ``side`` billed fewer, as many, or more tokens than ``other``."""
    counts = {"fewer": 0, "same": 0, "more": 0}
    for row in rows:
        mine, theirs = row["sides"][side].billed, row["sides"][other].billed
        counts["fewer" if mine < theirs else "same" if mine == theirs else "more"] += 1
    return counts


def conversation_rows(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    """Per conversation: its id, file, size, and each side's totals."""
    return [
        {
            "id": row["id"],
            "file": row["file"],
            "messages": row["messages"],
            "sides": {name: row["sides"][name].as_json() for name in names},
        }
        for row in rows
    ]


def index_medians(rows: Sequence[dict[str, Any]], name: str, *, upto: int) -> list[list[float]]:
    """``[index, median tokens sent]`` at each message index up to ``upto`` with at least
    10 calls, for one side (the plot's curves)."""
    from bench.common import percentile

    by_index: dict[int, list[int]] = {}
    for row in rows:
        for call in row["sides"][name].calls:
            if call.index <= upto:
                by_index.setdefault(call.index, []).append(call.sent)
    return [
        [index, percentile(values, 50)]
        for index, values in sorted(by_index.items())
        if len(values) >= 10
    ]
