"""Every GET of a compacted conversation against the length of its history: the detail
(with its stats), the context, the transcript's and the summary list's first and last pages
(50 a page), the facts' first page, and the first pages again with as many rows as the
shortest history's (``…_same``: its 20 messages, its one summary, its key facts), through
Django's test client logged in as the owner.

Compacted target conversations of 20, 1,000, 10,000 and 100,000 messages, built as
bench.scaling builds its compacted ones (bench/scaling_state.py: the data's agent history
written with ``bulk_create``, compacted by the service after every ``--batch`` messages, the
same 6 messages last; ``--summarizer``: the offline backend, the default, whose key facts
the conversations then hold, or the fixed 120-token summary), among every dialogue of the data as a
conversation of its own and one other conversation of ``--other-large`` messages; then
ANALYZE and CHECKPOINT (this machine's PostgreSQL runs without autovacuum). Each round calls
every read of every target ``--calls`` times, the targets' order rotated by one each round;
the queries of an untimed first call are recorded, and on PostgreSQL, after the rounds, the
plan of each of them that reads ctxsum's tables (``EXPLAIN (ANALYZE, BUFFERS)``). SQLite,
then PostgreSQL, each in a process of its own; results in docs/PERFORMANCE.md.

    python -m bench.history_reads [--sizes N ...] [--rounds R] [--calls N] [--batch N]
                                  [--summarizer offline|fixed] [--other-large N] [--dialogues N]
                                  [--database-url URL | --no-postgres] [--output PATH]
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.command import add_command_options, backend_django, per_database_main
from bench.common import SUMMARIZERS, write_json
from bench.scaling_state import add_table_options

SIZES = (20, 1_000, 10_000, 100_000)
DEFAULT_DATABASE = "postgres://root@127.0.0.1:5432/wtperf_history_reads"
READS = (
    "detail",
    "context",
    "transcript_first",
    "transcript_last",
    "summaries_first",
    "summaries_last",
    "facts",
    "transcript_first_same",
    "summaries_first_same",
    "facts_same",
)
PAGE = 50  # the API's default page size
# A plan that reads the whole message table: what a read of one conversation must not do.
SCAN = "Seq Scan on ctxsum_message"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.history_reads", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), metavar="N")
    parser.add_argument("--rounds", type=int, default=10, help="rounds (default 10)")
    parser.add_argument("--calls", type=int, default=10, help="timed calls of each read a round")
    parser.add_argument("--summarizer", choices=tuple(SUMMARIZERS), default="offline")
    add_table_options(parser)
    add_command_options(parser, default_database=DEFAULT_DATABASE, plots=False)
    return parser.parse_args(argv)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Same:
    """The rows of the shortest history's first pages: the ``…_same`` reads ask for as many."""

    messages: int
    summaries: int
    facts: int


def read_urls(conversation: Any, same: Same) -> dict[str, str]:
    """The URL of every read of ``conversation``, the last pages' included."""
    base = f"/api/conversations/{conversation.pk}/"
    last_message_page = max(1, math.ceil(conversation.message_count / PAGE))
    last_summary_page = max(1, math.ceil(conversation.summary_count / PAGE))
    return {
        "detail": base,
        "context": f"{base}context/",
        "transcript_first": f"{base}messages/",
        "transcript_last": f"{base}messages/?page={last_message_page}",
        "summaries_first": f"{base}summaries/",
        "summaries_last": f"{base}summaries/?page={last_summary_page}",
        "transcript_first_same": f"{base}messages/?page_size={same.messages}",
        "summaries_first_same": f"{base}summaries/?page_size={same.summaries}",
        "facts_same": f"{base}facts/?page_size={same.facts}",
        "facts": f"{base}facts/",
    }


def reads(target: Any, client: Any, same: Same) -> list[Any]:
    """The reads of ``target`` as operations of bench.scaling_measure (nothing to reset)."""
    from bench.scaling_measure import Operation

    def get(url: str) -> Callable[[], bytes]:
        def call() -> bytes:
            response = client.get(url)
            if response.status_code != 200:
                raise RuntimeError(f"GET {url}: {response.status_code} {response.content[:200]!r}")
            content: bytes = response.content
            return content

        return call

    urls = read_urls(target.built.conversation, same)
    return [Operation(name, get(urls[name]), lambda: None) for name in READS]


def measure(
    targets: Sequence[Any], client: Any, same: Same, *, rounds: int, calls: int
) -> dict[str, dict[str, Any]]:
    """Every read of every target, ``rounds`` rounds of ``calls`` calls, the targets' order
    rotated by one each round; each read's first call (untimed) gives its queries."""
    from bench.scaling_measure import captured, operation_figures, time_calls

    ops = {target.name: reads(target, client, same) for target in targets}
    queries = {name: {op.name: captured(op) for op in each} for name, each in ops.items()}
    samples: dict[str, dict[str, list[list[float]]]] = {
        target.name: {name: [] for name in READS} for target in targets
    }
    for number in range(rounds):
        shift = number % len(targets)
        for target in [*targets[shift:], *targets[:shift]]:
            for op in ops[target.name]:
                gc.collect()
                samples[target.name][op.name].append(time_calls(op, calls))
        progress(f"round {number + 1}/{rounds}")
    return {
        target.name: {
            name: operation_figures(samples[target.name][name], queries[target.name][name])
            for name in READS
        }
        for target in targets
    }


def plans(
    targets: Sequence[Any], client: Any, same: Same
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """On PostgreSQL, each read's queries of ctxsum's tables with their ``EXPLAIN (ANALYZE,
    BUFFERS)`` on this table, by target and read: what the planner chose, where a read
    costs more than its rows; nothing on SQLite."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        return {}
    found: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for target in targets:
        urls = read_urls(target.built.conversation, same)
        for name in READS:
            with CaptureQueriesContext(connection) as captured:
                client.get(urls[name])
            ours = [
                query["sql"] for query in captured.captured_queries if '"ctxsum_' in query["sql"]
            ]
            found.setdefault(target.name, {})[name] = [explained(sql) for sql in ours]
    return found


def explained(sql: str) -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
        return {"sql": sql, "plan": [row[0] for row in cursor.fetchall()]}


def run_backend(args: argparse.Namespace) -> dict[str, Any]:
    """Build the targets among the other conversations, then measure (Django set up)."""
    from django.test import Client

    from bench.common import bench_owner
    from bench.scaling_measure import Target, ratio
    from bench.scaling_state import load_pool, others_build, settle, table_facts, target_build
    from ctxsum.facts.block import facts_visible
    from tests.support.run_info import database_info

    started = time.perf_counter()
    pool = load_pool(args.data_dir, dialogues=args.dialogues)
    owner, other = bench_owner("ctxsum-history-reads"), bench_owner("ctxsum-history-other")
    others = others_build(pool, owner=other, large=args.other_large)
    targets = []
    for size in args.sizes:
        built = target_build(pool, owner=owner, size=size, compacted=True, batch=args.batch)
        targets.append(Target(f"{size}", size, True, built))
        progress(f"{args.backend}: built {size:,} in {built.seconds:.1f} s")
    settle()
    build_seconds = round(time.perf_counter() - started, 1)
    client = Client()
    client.force_login(owner)
    small, large = targets[0], targets[-1]
    shortest = small.built.conversation
    facts = facts_visible(shortest).count()
    same = Same(
        *(
            max(1, min(PAGE, rows))
            for rows in (shortest.message_count, shortest.summary_count, facts)
        )
    )
    results = measure(targets, client, same, rounds=args.rounds, calls=args.calls)
    explains = plans(targets, client, same)
    return {
        "database": database_info(),
        "tables": table_facts(),
        "others": others,
        "build_seconds": build_seconds,
        "same_rows": {"messages": same.messages, "summaries": same.summaries, "facts": facts},
        "targets": [
            {
                "size": target.size,
                "history": target.built.history,
                "summaries": target.built.summaries,
                "key_facts": facts_visible(target.built.conversation).count(),
                "reads": results[target.name],
                "plans": explains.get(target.name, {}),
            }
            for target in targets
        ],
        "ratios": {
            f"{large.size:,} / {small.size:,}": {
                name: ratio(results[large.name][name], results[small.name][name]) for name in READS
            }
        },
    }


def backend_main(args: argparse.Namespace) -> int:
    """One backend in this process: write its part of the results to ``--part``."""
    summarizer = {"SUMMARIZER": SUMMARIZERS[args.summarizer]}
    with backend_django(args, prefix="ctxsum-history-reads-", ctxsum=summarizer):
        part = run_backend(args)
    write_json(part, args.part)
    return 0


def summary_lines(report: dict[str, Any]) -> list[str]:
    """Each read's median milliseconds by size, and the largest over the smallest; then
    the reads whose plan scans the message table whole."""
    lines = []
    for backend, part in report["backends"].items():
        for name in READS:
            medians = [f"{t['reads'][name]['ms']['median']:.2f}" for t in part["targets"]]
            ratios = [value[name]["median"] for value in part["ratios"].values()]
            lines.append(f"{backend} {name}: {' / '.join(medians)} ms, ratio {ratios}")
        for target in part["targets"]:
            for name, queries in target.get("plans", {}).items():
                plan = [line for query in queries for line in query["plan"]]
                if any(SCAN in line for line in plan):
                    lines.append(f"{backend} {name} at {target['size']:,}: {SCAN}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return per_database_main(
        "history_reads",
        argv,
        parse_args=parse_args,
        backend_main=backend_main,
        draw=lambda report: [],
        options=("sizes", "rounds", "calls", "batch", "summarizer"),
        lines=summary_lines,
    )


if __name__ == "__main__":
    sys.exit(main())
