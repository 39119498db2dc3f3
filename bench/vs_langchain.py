"""ctxsum against LangChain v1's SummarizationMiddleware on the real conversations.

Every conversation of the data is replayed, one model call per recorded assistant turn, by:
the full history; a window of the last 6 and of the last 12 messages (system message kept,
tool-pair safe); LangChain's middleware with the system message as the agent's
``system_prompt`` and with it in the state; and ctxsum through its service layer. Both
summarizing sides use trigger 12 messages / keep 6 and the same fixed 120-token summary.
Tokens are counted with ctxsum.tokens (o200k_base) on every side. See docs/PERFORMANCE.md.

    python -m bench.vs_langchain [--limit N] [--files NAME ...] [--data-dir DIR] [--jobs N]
                                 [--check] [--output PATH] [--no-plots]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    IMAGES_DIR,
    KEEP_MESSAGES,
    RESULTS_DIR,
    TRIGGER_MESSAGES,
    run_facts,
    write_json,
)
from bench.vs_run import Options, run_all, side_names
from tests.support.run_info import load_average
from tests.support.shared import DATA_DIR, DATA_FILES, use_tiktoken_cache

PLOT_SIDES = ("full", "window_12", "langchain", "langchain_in_state", "ctxsum")
# ctxsum's summarizer backend: the fixed summary with the key facts the offline backend
# finds (ctxsum's defaults ask for facts and show them), or the fixed summary alone.
SUMMARIZERS = {
    "facts": "bench.fixed_summary.FixedFactsSummarizer",
    "fixed": "bench.fixed_summary.FixedSummarizer",
}


def setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--set``: a CTXSUM key and its value as JSON (else the text)."""
    key, sep, value = text.partition("=")
    if not sep or not key.isupper():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE with a CTXSUM key")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vs_langchain",
        description="Replay the real conversations through ctxsum and LangChain's "
        "SummarizationMiddleware and compare the tokens sent and billed.",
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--files", nargs="+", default=list(DATA_FILES), metavar="NAME")
    parser.add_argument(
        "--limit", type=int, default=None, metavar="N", help="at most N conversations of each file"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        metavar="N",
        help="worker processes, each with its own SQLite file (default 2)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="recount every context ctxsum sends and fail on a difference",
    )
    parser.add_argument(
        "--summary",
        choices=SUMMARIZERS,
        default="facts",
        help="ctxsum's summarizer: the fixed summary with the offline backend's key facts "
        "(default) or alone",
    )
    parser.add_argument(
        "--set",
        type=setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a CTXSUM setting of ctxsum's side (VALUE as JSON), e.g. FACTS_MAX_TOKENS=0",
    )
    parser.add_argument("--output", type=Path, default=None, metavar="PATH")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument(
        "--plots-from",
        type=Path,
        default=None,
        metavar="JSON",
        help="only redraw the plots from a results file of this command",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or (args.limit is not None and args.limit < 1):
        parser.error("--jobs and --limit must be at least 1")
    return args


def build_report(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    from bench.vs_report import aggregate, conversation_rows, index_medians, wins

    names = side_names()
    files = sorted({row["file"] for row in rows})
    agents = [row for row in rows if row["file"].startswith("agent")] or rows
    longest = max(rows, key=lambda row: row["messages"])
    return {
        "policy": {"trigger": {"messages": TRIGGER_MESSAGES}, "keep": {"messages": KEEP_MESSAGES}},
        "summary_tokens": 120,
        "conversations": len(rows),
        "messages": sum(row["messages"] for row in rows),
        "sides": aggregate(rows, names),
        "by_file": {
            name: aggregate([r for r in rows if r["file"] == name], names) for name in files
        },
        "ctxsum_vs_langchain": {
            other: wins(rows, "ctxsum", other) for other in ("langchain", "langchain_in_state")
        },
        "median_sent_by_index_agent_runs": {
            name: index_medians(agents, name, upto=120) for name in PLOT_SIDES
        },
        "longest": {
            "id": longest["id"],
            "messages": longest["messages"],
            "calls": {
                name: [[call.index, call.sent] for call in longest["sides"][name].calls]
                for name in PLOT_SIDES
            },
        },
        "per_conversation": conversation_rows(rows, names),
    }


def draw(report: dict[str, Any]) -> list[Path]:
    from bench.plots import billed_plot, curves_plot

    names = side_names()
    groups = {"all": report["sides"], **report["by_file"]}
    longest = report["longest"]
    return [
        billed_plot(groups, names, IMAGES_DIR / "perf-vs-langchain-billed.png"),
        curves_plot(
            report["median_sent_by_index_agent_runs"],
            IMAGES_DIR / "perf-vs-langchain-per-call.png",
            title="Agent runs: median tokens sent per call at each message index",
            log_y=True,
        ),
        curves_plot(
            longest["calls"],
            IMAGES_DIR / "perf-vs-langchain-longest.png",
            title=f"Tokens sent per call, {longest['id'][:48]}… ({longest['messages']} messages)",
            log_y=True,
        ),
    ]


def format_text(report: dict[str, Any]) -> str:
    lines = [f"conversations {report['conversations']}, messages {report['messages']}"]
    for group, sides in {"all": report["sides"], **report["by_file"]}.items():
        lines.append(
            f"[{group}]  side: median sent/call (all, >=20, >=50) | billed | "
            "% full | % window_12 | system kept"
        )
        for name, side in sides.items():
            per_call = side["per_call"]
            medians = [per_call[f"from_index_{i}"]["with_system"]["median"] for i in (0, 20, 50)]
            kept = f"{side['system_kept_in_every_call']}/{side['conversations_with_system']}"
            vs = side["billed_vs"]
            lines.append(
                f"  {name:20} {medians} | {side['billed']:,} | {100 * vs['full']:.1f} % | "
                f"{100 * vs['window_12']:.1f} % | {kept}"
            )
    lines.append(
        f"ctxsum vs LangChain (conversations billed fewer/same/more): "
        f"{report['ctxsum_vs_langchain']}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.plots_from is not None:
        for path in draw(json.loads(args.plots_from.read_text(encoding="utf-8"))):
            print(f"  plot: {path}")
        return 0
    use_tiktoken_cache()
    started, facts = time.perf_counter(), run_facts()
    ctxsum = (("SUMMARIZER", SUMMARIZERS[args.summary]), *args.set)
    options = Options(args.data_dir, tuple(args.files), args.limit, args.jobs, args.check, ctxsum)
    rows = run_all(options)
    report = {
        "benchmark": "vs_langchain",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.vs_langchain", *argv]),
        "jobs": args.jobs,
        "ctxsum_settings": dict(ctxsum),
        **facts,
        **build_report(rows, args),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "load_average_end": load_average(),
    }
    output = args.output or RESULTS_DIR / f"vs-langchain-{report['date'][:10]}.json"
    write_json(report, output)
    print(format_text(report))
    if not args.no_plots:
        for path in draw(report):
            print(f"  plot: {path}")
    print(f"  results: {output}  ({report['wall_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
