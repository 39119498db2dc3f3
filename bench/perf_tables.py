"""Markdown tables for docs/PERFORMANCE.md from the results' JSON, so the numbers in the
document are the measured ones, copied by no one.

    python -m bench.perf_tables bench/results/vs-langchain-<date>.json
    python -m bench.perf_tables bench/results/prepare-call-<date>.json
    python -m bench.perf_tables bench/results/scaling-<date>.json
    python -m bench.perf_tables bench/results/throughput-<date>.json
    python -m bench.perf_tables bench/results/background-<date>.json
    python -m bench.perf_tables --compare vs-langchain-a.json vs-langchain-b.json ...

``--compare`` sets runs of bench.vs_langchain with other ctxsum settings (``--set``) side by
side: ctxsum's compactions per 100 model calls and its billed tokens, on each file and in all,
against the full history and LangChain (system prompt kept), from each run's ``--limit``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.plots import LABELS


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


PER_CALL_HEADER = [
    "side",
    "calls",
    "all calls",
    "index ≥ 20",
    "index ≥ 50",
    "all, without system",
    "≥ 50, without system",
]
BILLED_HEADER = [
    "side",
    "sent by the calls",
    "summarizer in + out (calls)",
    "billed",
    "vs full",
    "vs last 6",
    "vs last 12",
    "system prompt in every call",
]


def _cell(per_call: dict[str, Any], start: int, key: str = "with_system") -> str:
    figures = per_call[f"from_index_{start}"][key]
    return f"{figures['median']:,.0f} ({figures['p95']:,.0f})" if figures["n"] else "-"


def per_call_table(sides: dict[str, Any]) -> list[str]:
    """Median (p95) tokens sent per call, with and without the system message."""
    lines = [_row(PER_CALL_HEADER), _row(["---"] * len(PER_CALL_HEADER))]
    for name, side in sides.items():
        per_call = side["per_call"]
        cells = [_cell(per_call, start) for start in (0, 20, 50)]
        cells += [_cell(per_call, 0, "without_system"), _cell(per_call, 50, "without_system")]
        lines.append(_row([LABELS.get(name, name), f"{side['calls']:,}", *cells]))
    return lines


def billed_table(sides: dict[str, Any]) -> list[str]:
    """Tokens billed, against the full history and the windows, and the system prompt."""
    lines = [_row(BILLED_HEADER), _row(["---"] * len(BILLED_HEADER))]
    for name, side in sides.items():
        vs = side["billed_vs"]
        summarizer = (
            f"{side['summarizer_in']:,} + {side['summarizer_out']:,} ({side['summarizer_calls']:,})"
        )
        kept = f"{side['system_kept_in_every_call']} / {side['conversations_with_system']}"
        shares = [f"{100 * vs[base]:.1f} %" for base in ("full", "window_6", "window_12")]
        cells = [LABELS.get(name, name), f"{side['sent']:,}", summarizer, f"{side['billed']:,}"]
        lines.append(_row([*cells, *shares, kept]))
    return lines


def prepare_table(report: dict[str, Any]) -> list[str]:
    """Per backend and size: every side's CPU µs per call, and the ratios."""
    lines: list[str] = []
    for backend, part in report["backends"].items():
        lines += ["", f"{backend} ({part['database']['vendor']} {part['database']['version']})", ""]
        first = part["sizes"][0]
        names = list(first["sides"])
        lines.append(_row(["history", "summaries", *names, *first["ratios_total_cpu"]]))
        lines.append(_row(["---"] * (2 + len(names) + len(first["ratios_total_cpu"]))))
        for row in part["sizes"]:
            cells = [f"{row['sides'][n]['total_cpu_us']:,.0f}" for n in names]
            ratios = [f"{value:,.1f}x" for value in row["ratios_total_cpu"].values()]
            lines.append(_row([f"{row['size']:,}", f"{row['summaries']:,}", *cells, *ratios]))
    return lines


def _ms(figures: dict[str, Any]) -> str:
    """Median (p95) milliseconds, to three significant figures or so."""
    return f"{_short(figures['median'])} ({_short(figures['p95'])})"


def _short(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


TIMES = "\u00d7"
SCALING_HEADER = [
    "conversation",
    "database",
    "history",
    "summaries",
    "context: messages (tokens)",
    "append ms",
    "q",
    "context_get ms",
    "q",
    "REST context ms",
    "q",
]


def scaling_table(report: dict[str, Any]) -> list[str]:
    """Per target: median (p95) ms and queries of each operation; then the ratios and the
    read of the previous summary the REST answer makes."""
    lines = [_row(SCALING_HEADER), _row(["---"] * len(SCALING_HEADER))]
    for compacted in (True, False):
        for backend, part in report["backends"].items():
            for row in part["targets"]:
                if row["compacted"] != compacted:
                    continue
                ops = row["operations"]
                kind = "compacted" if compacted else "never compacted"
                cells = [f"{row['size']:,} {kind}", backend, f"{row['history']:,}"]
                cells += [f"{row['summaries']:,}"]
                cells += [f"{row['context_messages']:,} ({row['context_tokens']:,})"]
                for name in ("append", "context", "rest_context"):
                    cells += [_ms(ops[name]["ms"]), str(ops[name]["queries"])]
                lines.append(_row(cells))
    lines += ["", _row(["database", "compared", "append", "context_get", "REST context"])]
    lines.append(_row(["---"] * 5))
    for backend, part in report["backends"].items():
        for compared, figures in part["ratios"].items():
            cells = [
                f"{figures[name]['median']:.2f}{TIMES} ({figures[name]['extra_queries']:+d} q)"
                for name in ("append", "context", "rest_context")
            ]
            lines.append(_row([backend, compared, *cells]))
    header = [
        "history",
        "database",
        "previous version's coverage facts",
        "reading its row",
        "its version only",
        "the REST answer's serializer",
        "the same, previous version read alone",
    ]
    lines += ["", _row(header), _row(["---"] * len(header))]
    for backend, part in report["backends"].items():
        for row in part["targets"]:
            read = row.get("previous_summary_read")
            if read:
                facts = f"{read['coverage_facts']:,} ({read['coverage_json_bytes'] / 1000:,.0f} kB)"
                cells = [f"{row['history']:,}", backend, facts]
                cells += [
                    f"{read[name]:.2f} ms"
                    for name in (
                        "whole_row_ms",
                        "version_only_ms",
                        "serializer_ms",
                        "serializer_version_only_ms",
                    )
                ]
                lines.append(_row(cells))
    return lines


THROUGHPUT_HEADER = [
    "database",
    "processes",
    "ctxsum appends/s",
    "floor appends/s",
    "ctxsum / floor",
    "rounds: ctxsum / floor",
    "compactions/s",
    "rounds: compactions/s",
]


def throughput_table(report: dict[str, Any]) -> list[str]:
    """Per database and number of processes: the medians over rounds, and every round."""
    lines = [_row(THROUGHPUT_HEADER), _row(["---"] * len(THROUGHPUT_HEADER))]
    for backend, part in report["backends"].items():
        for processes, figures in part["processes"].items():
            median, rounds = figures["median"], figures["rounds"]
            shares = ", ".join(f"{100 * r['append_vs_floor']:.0f} %" for r in rounds)
            compactions = ", ".join(f"{r['compact']['per_second']:.1f}" for r in rounds)
            cells = [backend, processes, f"{median['append']:,.0f}", f"{median['floor']:,.0f}"]
            cells += [f"{100 * median['append_vs_floor']:.0f} %", shares]
            cells += [f"{median['compact']:,.1f}", compactions]
            lines.append(_row(cells))
    return lines


def background_table(report: dict[str, Any]) -> list[str]:
    """Per phase: appends timed, median, p95, p5, mean and slowest ms, and against idle."""
    header = [
        "phase",
        "appends",
        "median ms",
        "p95 ms",
        "p5 ms",
        "mean ms",
        "max ms",
        "median / idle",
    ]
    lines = [_row(header), _row(["---"] * len(header))]
    idle = report["phases"]["idle"]["ms"]["median"]
    for name, phase in report["phases"].items():
        ms = phase["ms"]
        cells = [name, f"{ms['n']:,}", f"{ms['median']:.2f}", f"{ms['p95']:.2f}", f"{ms['p5']:.2f}"]
        cells += [
            f"{ms['mean']:.2f}",
            f"{phase['max_ms']:.1f}",
            f"{ms['median'] / idle:.2f}{TIMES}",
        ]
        lines.append(_row(cells))
    return lines


TABLES = {
    "prepare_call": prepare_table,
    "scaling": scaling_table,
    "throughput": throughput_table,
    "background": background_table,
}


COMPARE_GROUPS = {
    "agent_trajectories.jsonl.gz": "agent runs",
    "long_chats.jsonl.gz": "dialogues",
    "all": "all",
}


def compare_table(reports: Sequence[dict[str, Any]]) -> list[str]:
    """One row a run: its ctxsum settings, then for each group ctxsum's compactions per 100
    model calls and its billed tokens as a share of the full history and of LangChain's."""
    header = ["ctxsum settings"]
    for label in COMPARE_GROUPS.values():
        header += [f"{label}: compactions / 100 calls", f"{label}: billed vs full, vs LangChain"]
    lines = [_row(header), _row(["---"] * len(header))]
    for report in reports:
        given = dict(report.get("ctxsum_settings", {}))
        summarizer = given.pop("SUMMARIZER", "")
        named = [f"{key}={value}" for key, value in given.items()]
        if summarizer.endswith(".FixedSummarizer"):
            named.append("no key facts (--summary fixed)")
        cells = [", ".join(named) or "defaults"]
        groups = {"all": report["sides"], **report["by_file"]}
        for group in COMPARE_GROUPS:
            if group not in groups:  # a run of one file
                cells += ["n/a", "n/a"]
                continue
            ctxsum, langchain = groups[group]["ctxsum"], groups[group]["langchain"]
            cells.append(f"{100 * ctxsum['summaries'] / ctxsum['calls']:.1f}")
            cells.append(
                f"{100 * ctxsum['billed_vs']['full']:.1f} %, "
                f"{100 * ctxsum['billed'] / langchain['billed']:.1f} %"
            )
        lines.append(_row(cells))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[0] == "--compare":
        reports = [json.loads(Path(arg).read_text(encoding="utf-8")) for arg in args[1:]]
        print("\n".join(compare_table(reports)))
        return 0
    path = Path(args[0])
    report = json.loads(path.read_text(encoding="utf-8"))
    if report["benchmark"] in TABLES:
        print("\n".join(TABLES[report["benchmark"]](report)))
        return 0
    for group, sides in {"all": report["sides"], **report["by_file"]}.items():
        print(f"\n### {group}\n")
        print("\n".join(per_call_table(sides)))
        print()
        print("\n".join(billed_table(sides)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
