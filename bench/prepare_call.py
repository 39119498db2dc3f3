"""CPU time to prepare one model call, ctxsum against LangChain's SummarizationMiddleware.

Preparing a call = append one user message, then get the messages to send, on a compacted
conversation with 100, 1,000, 10,000 and 100,000 messages of history (bench/prepare_state.py).
ctxsum runs through its service layer on SQLite and on PostgreSQL, each in a process of its
own; LangChain's middleware (its default approximate counter, and a tiktoken counter) is
measured in each of those processes, interleaved with ctxsum, so every ratio comes from one
run. See bench/prepare_measure.py for the clocks and docs/PERFORMANCE.md for results.

    python -m bench.prepare_call [--sizes N ...] [--rounds R] [--calls N] [--lc-calls N]
                                 [--database-url URL | --no-postgres] [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.command import add_command_options, backend_django, per_database_main
from bench.common import IMAGES_DIR, write_json
from tests.support.shared import DATA_DIR

SIZES = (100, 1_000, 10_000, 100_000)
DEFAULT_DATABASE = "postgres://root@127.0.0.1:5432/wtbench_prepare"
CTXSUM_SIDES = ("ctxsum append+context", "ctxsum append+compact")
LANGCHAIN_SIDES = ("LangChain default counter", "LangChain tiktoken counter")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.prepare_call", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), metavar="N")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per size (default 7)")
    parser.add_argument("--calls", type=int, default=40, help="ctxsum calls per round")
    parser.add_argument("--lc-calls", type=int, default=400, help="LangChain calls per round")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    add_command_options(parser, default_database=DEFAULT_DATABASE, plots=False)
    return parser.parse_args(argv)


def run_backend(args: argparse.Namespace) -> dict[str, Any]:
    """Build every size on this process's database, then measure each (Django set up)."""
    from bench.common import bench_owner
    from bench.prepare_state import agent_pool, build
    from tests.support.run_info import database_info

    owner = bench_owner("ctxsum-prepare-call")
    system, runs = agent_pool(args.data_dir)
    built = {size: build(owner=owner, system=system, runs=runs, size=size) for size in args.sizes}
    sizes = []
    for state in built.values():
        sizes.append(measure_size(args, state, system))
        print(f"  {args.backend} {state.history}: {json.dumps(sizes[-1]['ratios_total_cpu'])}")
    return {"database": database_info(), "calls": calls_per_round(args), "sizes": sizes}


def calls_per_round(args: argparse.Namespace) -> dict[str, int]:
    return {
        **dict.fromkeys(CTXSUM_SIDES, args.calls),
        **dict.fromkeys(LANGCHAIN_SIDES, args.lc_calls),
    }


def measure_size(args: argparse.Namespace, state: Any, system: str) -> dict[str, Any]:
    """Every side, ``args.rounds`` rounds, on one built conversation."""
    from bench.prepare_measure import (
        measure,
        medians,
        no_server,
        postgres_clock,
        ratios,
        summary_reads,
    )
    from bench.prepare_sides import ctxsum_sides, langchain_sides
    from bench.prepare_state import kept_messages
    from ctxsum.selectors import context_get

    context = context_get(conversation=state.conversation)
    sides = ctxsum_sides(state) + langchain_sides(system, kept_messages(context))
    server = postgres_clock() if args.backend == "postgresql" else no_server
    results = measure(sides, rounds=args.rounds, calls=calls_per_round(args), server=server)
    return {
        "size": state.history,
        "summaries": state.summaries,
        "summary_read": summary_reads(state.conversation, rounds=args.rounds),
        "build_seconds": round(state.seconds, 1),
        "context_messages_sent": len(context.messages) + 1,
        "sides": medians(results),
        "ratios_total_cpu": ratios(results, CTXSUM_SIDES, "total_cpu_us"),
        "ratios_wall": ratios(results, CTXSUM_SIDES, "wall_us"),
    }


def backend_main(args: argparse.Namespace) -> int:
    """One backend in this process: write its part of the results to ``--part``."""
    with backend_django(args, prefix="ctxsum-prepare-"):
        part = run_backend(args)
    write_json(part, args.part)
    return 0


def draw(report: dict[str, Any]) -> list[Path]:
    from bench.plots import scaling_plot

    series: dict[str, list[list[float]]] = {}
    for backend, part in report["backends"].items():
        for row in part["sizes"]:
            for name, side in row["sides"].items():
                if name not in CTXSUM_SIDES and backend != "sqlite":
                    continue  # LangChain, measured in both processes: the SQLite one's
                where = backend if name in CTXSUM_SIDES else "in the SQLite process"
                label = f"{name} ({where})"
                series.setdefault(label, []).append([row["size"], side["total_cpu_us"]])
    path = IMAGES_DIR / "perf-prepare-call.png"
    title = "CPU time to prepare one model call (client + database server)"
    return [scaling_plot(series, path, title=title, ylabel="µs per call (median of rounds)")]


def main(argv: Sequence[str] | None = None) -> int:
    return per_database_main(
        "prepare_call",
        argv,
        parse_args=parse_args,
        backend_main=backend_main,
        draw=draw,
        options=("rounds",),
    )


if __name__ == "__main__":
    sys.exit(main())
