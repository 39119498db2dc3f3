"""Append, context read and REST context read against the history's length, on a table that
also holds other conversations.

Target conversations of 10, 1,000, 10,000 and 100,000 messages, each size compacted and
never compacted, among every dialogue of the data as a conversation of its own and one
agent conversation of 100,000 messages (bench/scaling_state.py); the operations and their
clocks are in bench/scaling_measure.py. SQLite, then PostgreSQL, each in a process of its
own; results in docs/PERFORMANCE.md.

    python -m bench.scaling [--sizes N ...] [--rounds R] [--calls N] [--heavy-rounds R]
                            [--heavy-calls N] [--database-url URL | --no-postgres]
                            [--output PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.command import add_command_options, backend_django, per_database_main
from bench.common import IMAGES_DIR, write_json
from bench.scaling_state import add_table_options

SIZES = (10, 1_000, 10_000, 100_000)
DEFAULT_DATABASE = "postgres://root@127.0.0.1:5432/wtperf_scaling"
# Never compacted targets from this size on are "heavy": their context is the whole history
# (up to 100,000 messages, seconds and hundreds of MB a read), read in fewer rounds.
BIG = 10_000


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), metavar="N")
    parser.add_argument("--rounds", type=int, default=10, help="rounds (default 10)")
    parser.add_argument(
        "--calls", type=int, default=10, help="timed calls of each operation per round"
    )
    parser.add_argument(
        "--heavy-rounds",
        type=int,
        default=3,
        help=f"rounds of the never compacted targets of {BIG:,}+ messages (default 3)",
    )
    parser.add_argument(
        "--heavy-calls",
        type=int,
        default=1,
        help="their timed context reads per round (default 1; appends: --calls)",
    )
    add_table_options(parser)
    add_command_options(parser, default_database=DEFAULT_DATABASE)
    return parser.parse_args(argv)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def targets_build(pool: Any, owner: Any, args: argparse.Namespace) -> list[Any]:
    """The measured conversations: one of each size, compacted and not."""
    from bench.scaling_measure import Target
    from bench.scaling_state import target_build

    targets = []
    for compacted in (True, False):
        for size in args.sizes:
            built = target_build(
                pool, owner=owner, size=size, compacted=compacted, batch=args.batch
            )
            kind = "compacted" if compacted else "uncompacted"
            targets.append(Target(f"{size} {kind}", size, compacted, built))
            progress(f"{args.backend}: built {size:,} {kind} in {built.seconds:.1f} s")
    return targets


def run_backend(args: argparse.Namespace) -> dict[str, Any]:
    """Build the mixed table on this process's database, then measure (Django set up)."""
    from django.test import Client

    from bench.common import bench_owner
    from bench.scaling_measure import Target, measure, previous_summary_read
    from bench.scaling_state import load_pool, others_build, settle, table_facts
    from tests.support.run_info import database_info

    started = time.perf_counter()
    pool = load_pool(args.data_dir, dialogues=args.dialogues)
    progress(f"{args.backend}: data read and counted ({time.perf_counter() - started:.0f} s)")
    owner, other = bench_owner("ctxsum-scaling"), bench_owner("ctxsum-scaling-other")
    others = others_build(pool, owner=other, large=args.other_large)
    progress(f"{args.backend}: other conversations: {others}")
    targets = targets_build(pool, owner, args)
    settle()
    facts = table_facts()
    build_seconds = round(time.perf_counter() - started, 1)
    progress(f"{args.backend}: tables {facts}, built in {build_seconds} s")
    client = Client()
    client.force_login(owner)

    def heavy(target: Target) -> bool:
        return not target.compacted and target.size >= BIG

    def calls(target: Target, operation: str) -> int:
        count: int = args.heavy_calls if heavy(target) and operation != "append" else args.calls
        return count

    results = measure(
        targets,
        client,
        rounds=args.rounds,
        heavy_rounds=args.heavy_rounds,
        calls=calls,
        heavy=heavy,
        progress=lambda message: progress(f"{args.backend}: {message}"),
    )
    for target in targets:
        if target.compacted:
            results[target.name]["previous_summary_read"] = previous_summary_read(
                target.built.conversation, rounds=args.rounds
            )
    return {
        "database": database_info(),
        "tables": facts,
        "others": others,
        "build_seconds": build_seconds,
        "targets": [target_facts(target, results[target.name], client) for target in targets],
        "ratios": ratios(targets, results),
    }


def target_facts(target: Any, results: dict[str, Any], client: Any) -> dict[str, Any]:
    from bench.scaling_measure import OPERATIONS
    from ctxsum.selectors import context_get

    built = target.built
    context = context_get(conversation=built.conversation)
    body = client.get(f"/api/conversations/{built.conversation.pk}/context/").content
    return {
        "name": target.name,
        "size": target.size,
        "compacted": target.compacted,
        "history": built.history,
        "summaries": built.summaries,
        "build_seconds": round(built.seconds, 1),
        "context_messages": len(context.messages),
        "context_tokens": context.token_count,
        "rest_bytes": len(body),
        "operations": {name: results[name] for name in OPERATIONS},
        "previous_summary_read": results.get("previous_summary_read"),
    }


def ratios(targets: Sequence[Any], results: dict[str, Any]) -> dict[str, Any]:
    """Largest over smallest size, compacted and not, for every operation."""
    from bench.scaling_measure import OPERATIONS, ratio

    out: dict[str, Any] = {}
    for compacted in (True, False):
        kind = [target for target in targets if target.compacted == compacted]
        if len(kind) < 2:
            continue
        small, large = min(kind, key=lambda t: t.size), max(kind, key=lambda t: t.size)
        key = f"{large.size:,} / {small.size:,} {'compacted' if compacted else 'never compacted'}"
        out[key] = {
            name: ratio(results[large.name][name], results[small.name][name]) for name in OPERATIONS
        }
    return out


def backend_main(args: argparse.Namespace) -> int:
    """One backend in this process: write its part of the results to ``--part``."""
    with backend_django(args, prefix="ctxsum-scaling-"):
        part = run_backend(args)
    write_json(part, args.part)
    return 0


def draw(report: dict[str, Any]) -> list[Path]:
    from bench.plots import scaling_operations_plot

    path = IMAGES_DIR / "perf-scaling.png"
    return [scaling_operations_plot(report["backends"], path)]


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The median ratios, largest size over smallest, of every database."""
    lines = []
    for name, part in report["backends"].items():
        for key, value in part["ratios"].items():
            figures = {op: figures["median"] for op, figures in value.items()}
            lines.append(f"{name} {key}: {figures}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return per_database_main(
        "scaling",
        argv,
        parse_args=parse_args,
        backend_main=backend_main,
        draw=draw,
        options=("rounds", "calls", "heavy_rounds", "heavy_calls"),
        lines=summary_lines,
    )


if __name__ == "__main__":
    sys.exit(main())
