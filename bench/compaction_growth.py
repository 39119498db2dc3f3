"""A compaction's CPU time and the size of the summary row it writes, against the length of
the history before it: the same messages archived at 100, 1,000, 10,000 and 100,000
messages of history.

Each conversation is built as bench.scaling builds its compacted ones
(bench/scaling_state.py): the data's agent history written with ``bulk_create`` and
compacted by the service after every ``--batch`` messages, here with the offline summarizer
by default (``--summarizer``: its summaries keep the names, numbers and identifiers the
coverage check looks for, as a model's would); the history ends with the same 6 messages
(kept by its last compaction), then the same ``--archive`` messages are written after it.
The measured compaction (``conversation_compact(force=True)``, the policy trigger 12 / keep
6) archives those 6 and all but the last 6 of the new ones: the same messages at every
length. Then ANALYZE and CHECKPOINT (this machine's PostgreSQL runs without autovacuum).

Each round runs the measured compaction once on every conversation (the order rotated by
one each round) inside a transaction rolled back after it, so every round compacts the same
state: the process's CPU time and the wall time of the call (the commit's fsync is not in
it), and, from the first round, the row it wrote (its coverage facts, their JSON, the
stored size of the row and of its coverage column) and, with ``ctxsum.facts`` installed,
the key facts the conversation had and what the compaction wrote to them. The queries of an
untimed first call are recorded; ``--profile`` adds a cProfile of one more call on the
longest history.
SQLite, then PostgreSQL, each in a process of its own; results in docs/PERFORMANCE.md.

    python -m bench.compaction_growth [--sizes N ...] [--archive N] [--batch N] [--rounds R]
                                      [--summarizer offline|fixed] [--profile]
                                      [--database-url URL | --no-postgres] [--output PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import pstats
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.command import add_command_options, per_database_main
from bench.common import (
    KEEP_MESSAGES,
    POLICY,
    SUMMARIZERS,
    disposable_database,
    setup_django,
    summary_of,
    write_json,
)
from tests.support.shared import DATA_DIR

SIZES = (100, 1_000, 10_000, 100_000)
DEFAULT_DATABASE = "postgres://root@127.0.0.1:5432/wtperf_compaction_growth"
PROFILE_LINES = 30


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compaction_growth", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), metavar="N")
    parser.add_argument(
        "--archive", type=int, default=50, help="messages the measured compaction archives"
    )
    parser.add_argument(
        "--batch", type=int, default=1_000, help="compact the history after every N messages"
    )
    parser.add_argument("--rounds", type=int, default=10, help="measured compactions of each")
    parser.add_argument("--summarizer", choices=tuple(SUMMARIZERS), default="offline")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile one compaction of the longest history"
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    add_command_options(parser, default_database=DEFAULT_DATABASE, plots=False)
    args = parser.parse_args(argv)
    if min(args.sizes) < args.archive + 2 * KEEP_MESSAGES + 2:
        parser.error("every size must exceed --archive by more than 13 messages")
    return args


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


@dataclass
class Grown:
    """A conversation of ``size`` messages whose next compaction is the measured one."""

    size: int
    conversation: Any
    history: int  # messages stored, the system message included
    summaries: int
    archives: int  # messages the measured compaction archives
    seconds: float


def grown_build(pool: Any, *, owner: Any, size: int, archive: int, batch: int) -> Grown:
    """History of ``size`` messages in all: the agent history, compacted after every
    ``batch`` messages, ending with the pool's 6 tail messages; then ``archive`` - 6 agent
    messages and the tail again, not compacted yet."""
    from bench.prepare_state import batches, history_stream
    from bench.scaling_state import history_insert
    from ctxsum.models import Summary
    from ctxsum.services import conversation_compact, conversation_create

    started = time.perf_counter()
    conversation = conversation_create(
        owner=owner, title=f"growth {size}", system=pool.system, **POLICY
    )
    fresh = [*history_stream(pool.runs, archive - KEEP_MESSAGES), *pool.tail]
    filler = history_stream(pool.runs[1:], size - 1 - KEEP_MESSAGES - len(fresh))
    for chunk in batches([*filler, *pool.tail], batch):
        history_insert(pool, [(conversation, chunk)])
        result = conversation_compact(conversation=conversation, force=True)
        if not result.compacted:
            raise RuntimeError(f"building {size}: the compaction did not run: {result.reason}")
    history_insert(pool, [(conversation, fresh)])
    conversation.refresh_from_db()
    return Grown(
        size=size,
        conversation=conversation,
        history=conversation.message_count,
        summaries=Summary.objects.filter(conversation=conversation).count(),
        archives=len(fresh),
        seconds=time.perf_counter() - started,
    )


class _Undo(Exception):
    """Raised inside the measured transaction to roll it back."""


def compact_undone(
    grown: Grown, around: contextlib.AbstractContextManager[Any] | None = None
) -> tuple[float, float, dict[str, Any]]:
    """The measured compaction (inside ``around``, when given), rolled back after it:
    milliseconds of process CPU and of wall time, and what the row it wrote holds."""
    from django.db import transaction

    from ctxsum.services import conversation_compact

    conversation = grown.conversation
    with contextlib.suppress(_Undo), transaction.atomic():
        cpu, wall = time.process_time_ns(), time.perf_counter_ns()
        with contextlib.nullcontext() if around is None else around:
            result = conversation_compact(conversation=conversation, force=True)
        cpu, wall = time.process_time_ns() - cpu, time.perf_counter_ns() - wall
        if not result.compacted or len(result.archived) != grown.archives:
            raise RuntimeError(f"{grown.size}: {result.reason}, {len(result.archived)} archived")
        row = {**summary_row(result.summary), **key_facts(conversation, result.summary)}
        raise _Undo
    conversation.refresh_from_db()
    return cpu / 1e6, wall / 1e6, row


def summary_row(summary: Any) -> dict[str, Any]:
    """What the new summary row holds: its coverage facts (count, JSON bytes), its text, and
    as stored: the coverage column and the row (PostgreSQL: ``pg_column_size``, compressed
    as stored; SQLite: the bytes of its text and JSON columns)."""
    from django.db import connection

    facts = summary.coverage_facts or []
    if connection.vendor == "postgresql":
        sql = "SELECT pg_column_size(s.coverage_facts), pg_column_size(s.*) FROM ctxsum_summary s"
    else:
        columns = ("text", "coverage_facts", "facts_skipped", "prompt_sha256", "model")
        row = " + ".join(f"coalesce(length(CAST({name} AS BLOB)), 0)" for name in columns)
        sql = f"SELECT length(CAST(coverage_facts AS BLOB)), {row} FROM ctxsum_summary"
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} WHERE id = %s", [summary.pk])
        coverage_bytes, row_bytes = cursor.fetchone()
    return {
        "coverage_facts": len(facts),
        "coverage_json_bytes": len(json.dumps(facts).encode()),
        "text_bytes": len(summary.text.encode()),
        "stored_coverage_bytes": coverage_bytes,
        "stored_row_bytes": row_bytes,
    }


def key_facts(conversation: Any, summary: Any) -> dict[str, Any]:
    """The key facts ``conversation`` holds (the new summary's included) and how many the
    summary created, updated and confirmed; nothing without ``ctxsum.facts``."""
    from django.apps import apps
    from django.db.models import Count

    if not apps.is_installed("ctxsum.facts"):
        return {}
    from ctxsum.facts.models import Fact, FactChange

    changes = FactChange.objects.filter(summary=summary).values_list("kind")
    return {
        "key_facts": Fact.objects.filter(conversation=conversation).count(),
        "key_fact_changes": dict(changes.annotate(count=Count("id")).order_by("kind")),
    }


def queries_of(grown: Grown) -> list[str]:
    """The SQL of one measured compaction (untimed, rolled back)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    captured = CaptureQueriesContext(connection)
    compact_undone(grown, captured)
    return [query["sql"][:160] for query in captured.captured_queries]


def profile_of(grown: Grown) -> list[str]:
    """cProfile of one measured compaction: the top functions by cumulative time."""
    profiler = cProfile.Profile()
    compact_undone(grown, profiler)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(PROFILE_LINES)
    return out.getvalue().splitlines()


def measure(grown: Sequence[Grown], *, rounds: int) -> dict[int, dict[str, Any]]:
    """``rounds`` measured compactions of each conversation, the order rotated by one each
    round; the queries of a first, untimed, one."""
    queries = {each.size: queries_of(each) for each in grown}
    cpu: dict[int, list[float]] = {each.size: [] for each in grown}
    wall: dict[int, list[float]] = {each.size: [] for each in grown}
    rows: dict[int, dict[str, Any]] = {}
    for number in range(rounds):
        shift = number % len(grown)
        for each in [*grown[shift:], *grown[:shift]]:
            gc.collect()
            cpu_ms, wall_ms, row = compact_undone(each)
            cpu[each.size].append(cpu_ms)
            wall[each.size].append(wall_ms)
            rows.setdefault(each.size, row)
        progress(f"round {number + 1}/{rounds}")
    return {
        each.size: {
            "cpu_ms": summary_of(cpu[each.size], digits=2),
            "wall_ms": summary_of(wall[each.size], digits=2),
            "row": rows[each.size],
            "queries": len(queries[each.size]),
            "sql": queries[each.size],
        }
        for each in grown
    }


@contextlib.contextmanager
def growth_django(args: argparse.Namespace) -> Iterator[None]:
    """Django set up on the database of ``--backend`` with ``--summarizer`` for the block:
    PostgreSQL's ``--database-url`` (created, then dropped after), or a SQLite file in a
    temporary folder."""
    url = args.database_url if args.backend == "postgresql" else None
    prefix = "ctxsum-compaction-growth-"
    with disposable_database(url), tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        setup_django(
            database_url=url,
            sqlite_dir=Path(tmp),
            # All of KEEP stays (LANDING "keep"): the measured compaction archives the same
            # --archive messages at every length.
            ctxsum={"SUMMARIZER": SUMMARIZERS[args.summarizer], "LANDING": "keep"},
        )
        try:
            yield
        finally:
            from django.db import connections

            connections.close_all()


def run_backend(args: argparse.Namespace) -> dict[str, Any]:
    """Build the conversations, then measure (Django set up)."""
    from bench.common import bench_owner
    from bench.scaling_state import load_pool, settle, table_facts
    from tests.support.run_info import database_info

    started = time.perf_counter()
    pool = load_pool(args.data_dir, dialogues=1)
    owner = bench_owner("ctxsum-compaction-growth")
    grown = []
    for size in args.sizes:
        grown.append(
            grown_build(pool, owner=owner, size=size, archive=args.archive, batch=args.batch)
        )
        progress(f"{args.backend}: built {size:,} in {grown[-1].seconds:.1f} s")
    settle()
    build_seconds = round(time.perf_counter() - started, 1)
    results = measure(grown, rounds=args.rounds)
    part: dict[str, Any] = {
        "database": database_info(),
        "tables": table_facts(),
        "build_seconds": build_seconds,
        "targets": [
            {
                "size": each.size,
                "history": each.history,
                "summaries": each.summaries,
                "archived": each.archives,
                **results[each.size],
            }
            for each in grown
        ],
    }
    if args.profile:
        part["profile"] = profile_of(max(grown, key=lambda each: each.size))
    return part


def backend_main(args: argparse.Namespace) -> int:
    """One backend in this process: write its part of the results to ``--part``."""
    with growth_django(args):
        part = run_backend(args)
    write_json(part, args.part)
    return 0


def summary_lines(report: dict[str, Any]) -> list[str]:
    """Median CPU milliseconds and the row's coverage facts and stored bytes by size, and
    the longest history's over the shortest's."""
    lines = []
    for backend, part in report["backends"].items():
        targets = part["targets"]
        cpu = [t["cpu_ms"]["median"] for t in targets]
        facts = [t["row"]["coverage_facts"] for t in targets]
        stored = [t["row"]["stored_row_bytes"] for t in targets]
        lines.append(
            f"{backend}: CPU {' / '.join(f'{ms:.1f}' for ms in cpu)} ms "
            f"(x{cpu[-1] / cpu[0]:.2f}); coverage facts {' / '.join(map(str, facts))}; "
            f"row {' / '.join(map(str, stored))} bytes (x{stored[-1] / stored[0]:.2f})"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return per_database_main(
        "compaction_growth",
        argv,
        parse_args=parse_args,
        backend_main=backend_main,
        draw=lambda report: [],
        options=("sizes", "archive", "batch", "rounds", "summarizer"),
        lines=summary_lines,
    )


if __name__ == "__main__":
    sys.exit(main())
