"""Markdown tables for docs/PERFORMANCE.md from the results' JSON, so the numbers in the
document are the measured ones, copied by no one.

    python -m bench.perf_tables bench/results/vs-langchain-<date>.json
    python -m bench.perf_tables bench/results/prepare-call-<date>.json
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


def main(argv: Sequence[str] | None = None) -> int:
    path = Path((sys.argv[1:] if argv is None else argv)[0])
    report = json.loads(path.read_text(encoding="utf-8"))
    if report["benchmark"] == "prepare_call":
        print("\n".join(prepare_table(report)))
        return 0
    for group, sides in {"all": report["sides"], **report["by_file"]}.items():
        print(f"\n### {group}\n")
        print("\n".join(per_call_table(sides)))
        print()
        print("\n".join(billed_table(sides)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
