"""The figures of ``bench.vs_langgraph`` and the Markdown tables of docs/PERFORMANCE.md.

Per size and side: every measured turn's figures (median, p95, p5, mean), apart for the
turns that compacted and the others; ctxsum's background runs; and the **amortized turn**:
per round, everything the side did (its turns, and ctxsum's background runs after them)
divided by the round's turns, then the median over rounds. Each ratio ctxsum / LangGraph is
taken round by round, then its median; the plain turn's ratio is that of the medians."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from importlib import metadata
from typing import Any

from bench.common import percentile, summary_of
from bench.wal_writes import Written

SIDES = ("ctxsum", "LangGraph")
CHECKPOINTER_PACKAGES = ("langgraph-checkpoint", "langgraph-checkpoint-postgres")
FIGURES = (
    "cpu_us",
    "server_us",
    "total_cpu_us",
    "wall_us",
    "wal_bytes",
    "wal_bytes_without_fpi",
    "rows",
)


def stats(samples: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float | int]]:
    return {figure: summary_of([sample[figure] for sample in samples]) for figure in FIGURES}


def round_totals(turns: Sequence[Any]) -> dict[int, dict[str, float]]:
    """Per round: every figure summed over its turns and the background runs after them,
    divided by its turns."""
    rounds: dict[int, list[Any]] = {}
    for turn in turns:
        rounds.setdefault(turn.round, []).append(turn)
    out: dict[int, dict[str, float]] = {}
    for number, members in sorted(rounds.items()):
        total = dict.fromkeys(FIGURES, 0.0)
        for turn in members:
            for sample in turn.samples():
                for figure, value in sample.figures().items():
                    total[figure] += value
        out[number] = {figure: value / len(members) for figure, value in total.items()}
    return out


def by_table(turns: Sequence[Any]) -> dict[str, dict[str, float]]:
    """WAL bytes and rows per turn by table, turns and background runs together."""
    totals: dict[str, Counter[str]] = {}
    for turn in turns:
        for sample in turn.samples():
            for table, entry in sample.written.by_table.items():
                totals.setdefault(table, Counter()).update(entry)
    return {
        table: {key: round(value / len(turns), 1) for key, value in entry.items()}
        for table, entry in sorted(totals.items(), key=lambda item: -item[1]["wal_bytes"])
    }


def side_figures(turns: Sequence[Any]) -> dict[str, Any]:
    """Everything reported of one side at one size."""
    rounds = round_totals(turns)
    backgrounds = [run for turn in turns if (run := turn.background()) is not None]
    return {
        "turns": len(turns),
        "compactions": sum(turn.compacted for turn in turns),
        "compaction_turns": [turn.number for turn in turns if turn.compacted],
        "task_outcomes": dict(Counter(o for turn in turns for o in turn.outcomes)),
        "turn": stats([turn.sample.figures() for turn in turns]),
        "turn_without_compaction": stats(
            [turn.sample.figures() for turn in turns if not turn.compacted]
        ),
        "turn_with_compaction": stats([turn.sample.figures() for turn in turns if turn.compacted]),
        "background": stats(backgrounds),
        "background_task": stats([turn.task.figures() for turn in turns if turn.task]),
        "background_check": stats([turn.check.figures() for turn in turns if turn.check]),
        "amortized": {
            figure: round(percentile([row[figure] for row in rounds.values()], 50), 1)
            for figure in FIGURES
        },
        "amortized_rounds": {str(number): row for number, row in rounds.items()},
        "by_table": by_table(turns),
    }


def ratios(ctxsum: Mapping[str, Any], langgraph: Mapping[str, Any]) -> dict[str, Any]:
    """ctxsum / LangGraph: of the plain turns' medians, and of the amortized turns round by
    round (median)."""

    def divided(top: float, bottom: float) -> float | None:
        return round(top / bottom, 3) if bottom else None

    amortized = {}
    for figure in FIGURES:
        values = [
            divided(row[figure], langgraph["amortized_rounds"][number][figure])
            for number, row in ctxsum["amortized_rounds"].items()
        ]
        known = [value for value in values if value is not None]
        amortized[figure] = round(percentile(known, 50), 3) if known else None
    return {
        "turn_median": {
            figure: divided(ctxsum["turn"][figure]["median"], langgraph["turn"][figure]["median"])
            for figure in FIGURES
        },
        "amortized": amortized,
    }


def thread_figures(thread: Any) -> dict[str, Any]:
    from ctxsum.models import Summary

    sides = {side: side_figures(thread.turns[side]) for side in SIDES}
    conversation = thread.built.conversation
    conversation.refresh_from_db()
    return {
        "size": thread.size,
        "history_built": {"ctxsum": thread.built.history, "LangGraph": thread.langgraph_history},
        "ctxsum_messages_after": conversation.message_count,
        "ctxsum_summaries": {
            "built": thread.built.summaries,
            "after": Summary.objects.filter(conversation=conversation).count(),
        },
        "sides": sides,
        "ratios": ratios(sides["ctxsum"], sides["LangGraph"]),
    }


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def report_fields(
    args: argparse.Namespace, threads: Sequence[Any], between: Written | None
) -> dict[str, Any]:
    """The report's own fields; ``between``: what the WAL holds of this database between
    the timed stretches (None: the WAL was not read)."""
    from tests.support.run_info import database_info

    return {
        "database": database_info(),
        "checkpointer": {name: _version(name) for name in CHECKPOINTER_PACKAGES},
        "sizes": list(args.sizes),
        "rounds": args.rounds,
        "turns": args.turns,
        "warm_up": args.warm_up,
        "wal_read": between is not None,
        # This database's WAL between the timed stretches of the rounds: the untimed
        # steps' (the checks made due), and anything a side wrote after its turn returned.
        "wal_between_turns": None if between is None else asdict(between),
        "results": [thread_figures(thread) for thread in threads],
    }


def _us(value: float) -> str:
    return f"{value:,.0f}"


def _ms(value: float) -> str:
    return f"{value / 1000:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _median_p95(entry: Mapping[str, float], show: Any = _us) -> str:
    return f"{show(entry['median'])} ({show(entry['p95'])})"


def turn_table(report: Mapping[str, Any]) -> list[str]:
    """One turn, median (p95) over every measured turn."""
    lines = [
        "| history | side | CPU µs, this process | CPU µs, server | CPU µs, both | wall ms "
        "| WAL bytes | rows written |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["results"]:
        for side in SIDES:
            turn = row["sides"][side]["turn"]
            cells = [
                _median_p95(turn["cpu_us"]),
                _median_p95(turn["server_us"]),
                _median_p95(turn["total_cpu_us"]),
                _median_p95(turn["wall_us"], _ms),
                _median_p95(turn["wal_bytes"]),
                _median_p95(turn["rows"]),
            ]
            lines.append(f"| {row['size']:,} | {side} | " + " | ".join(cells) + " |")
    return lines


def amortized_table(report: Mapping[str, Any]) -> list[str]:
    """The compaction (ctxsum's background run; LangGraph's turn that summarizes), then the
    turn with it amortized."""
    lines = [
        "| history | side | compactions / turns | compacting: CPU µs, both | wall ms "
        "| WAL bytes | amortized turn: CPU µs, both | wall ms | WAL bytes | rows |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["results"]:
        for side in SIDES:
            figures = row["sides"][side]
            one = figures["background" if side == "ctxsum" else "turn_with_compaction"]
            amortized = figures["amortized"]
            cells = [
                f"{figures['compactions']} / {figures['turns']}",
                _us(one["total_cpu_us"]["median"]),
                _ms(one["wall_us"]["median"]),
                _us(one["wal_bytes"]["median"]),
                _us(amortized["total_cpu_us"]),
                _ms(amortized["wall_us"]),
                _us(amortized["wal_bytes"]),
                f"{amortized['rows']:.1f}",
            ]
            lines.append(f"| {row['size']:,} | {side} | " + " | ".join(cells) + " |")
    return lines


def ratio_table(report: Mapping[str, Any]) -> list[str]:
    """ctxsum / LangGraph."""
    shown = ("total_cpu_us", "cpu_us", "wall_us", "wal_bytes", "rows")
    names = ("CPU, both", "CPU, this process", "wall", "WAL bytes", "rows")
    lines = [
        "| history | "
        + " | ".join(f"turn: {name}" for name in names[:4])
        + " | "
        + " | ".join(f"amortized: {name}" for name in names)
        + " |",
        "| --- |" + " --- |" * 9,
    ]
    for row in report["results"]:
        plain = [_ratio(row["ratios"]["turn_median"][figure]) for figure in shown[:4]]
        amortized = [_ratio(row["ratios"]["amortized"][figure]) for figure in shown]
        lines.append(f"| {row['size']:,} | " + " | ".join(plain + amortized) + " |")
    return lines


def table_table(report: Mapping[str, Any]) -> list[str]:
    """WAL bytes and rows of an amortized turn by table, at the largest size (tables under
    10 bytes a turn, the id sequences, left out)."""
    row = report["results"][-1]
    lines = [
        f"| side ({row['size']:,} messages) | table | WAL bytes per turn | rows per turn |",
        "| --- | --- | --- | --- |",
    ]
    for side in SIDES:
        for table, entry in row["sides"][side]["by_table"].items():
            if entry["wal_bytes"] < 10:
                continue
            name = "commit records" if table == "(commit)" else f"`{table}`"
            rows = "-" if table == "(commit)" else f"{entry['rows']:.1f}"
            lines.append(f"| {side} | {name} | {_us(entry['wal_bytes'])} | {rows} |")
    return lines


def tables(report: Mapping[str, Any]) -> list[str]:
    """Every table of the report, with a blank line between them."""
    out: list[str] = []
    for table in (turn_table, amortized_table, ratio_table, table_table):
        out.extend([*table(report), ""])
    return out
