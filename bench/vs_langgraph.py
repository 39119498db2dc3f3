"""One chat turn, ctxsum against LangGraph's PostgreSQL checkpointer with LangChain's
SummarizationMiddleware, on the same PostgreSQL database.

For each history length (100, 1,000 and 10,000 messages), a ctxsum conversation and a
LangGraph thread are built with the same history (bench/turn_sides.py), then ``ANALYZE``
and ``CHECKPOINT`` (this machine's PostgreSQL runs without autovacuum). After ``--warm-up``
untimed turns, each round makes ``--turns`` turns on each side for every size, the sides
alternating turn by turn (which goes first changes every round), the sizes' order rotated
by one each round. A ctxsum turn whose append enqueued the compaction is followed by the
background run of that task (and of its check), timed apart. Every turn and background run
is timed with bench/turn_clocks.py; what it wrote is read from the WAL afterwards
(bench/wal_writes.py). Statistics and tables: bench/turn_report.py; results in
docs/PERFORMANCE.md.

    python -m bench.vs_langgraph [--sizes N ...] [--rounds R] [--turns N] [--warm-up N]
                                 [--database-url URL] [--output PATH] [--tables-from JSON]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import POLICY
from bench.prepare_state import Built
from bench.turn_clocks import Clocks, Sample
from bench.wal_writes import Written
from tests.support.shared import DATA_DIR

if TYPE_CHECKING:  # importing it loads tiktoken's encoding, a command's first step
    from bench.turn_sides import Agent

# ctxsum's defaults but two: its turns of a few dozen tokens would never make a compaction
# that pays back its summarizer call (REQUIRE_PAYOFF), so that it compacts at its trigger as
# the middleware does, and keeps all of KEEP, as the middleware does (LANDING "keep"). Its
# compactions here are the most it would make: the amortized figures are an upper bound.
CTXSUM = {"AUTO_COMPACT": True, "REQUIRE_PAYOFF": False, "LANDING": "keep"}

SIZES = (100, 1_000, 10_000)
DEFAULT_DATABASE = "postgres://root@127.0.0.1:5432/wtperf_lg_turn"
SIDES = ("ctxsum", "LangGraph")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.vs_langgraph", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), metavar="N")
    parser.add_argument("--rounds", type=int, default=10, help="rounds (default 10)")
    parser.add_argument(
        "--turns",
        type=int,
        default=12,
        help="timed turns of each side per size and round (default 12: a whole number of "
        "ctxsum's compactions, every 2 turns, and of LangGraph's, every 3)",
    )
    parser.add_argument(
        "--warm-up", type=int, default=6, help="untimed turns of each side per size first"
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument(
        "--database-url",
        default=DEFAULT_DATABASE,
        help=f"PostgreSQL database to create, use and drop (default {DEFAULT_DATABASE})",
    )
    parser.add_argument("--output", type=Path, default=None, metavar="PATH")
    parser.add_argument(
        "--tables-from", type=Path, default=None, metavar="JSON", help="only print the tables"
    )
    return parser.parse_args(argv)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


@dataclass
class Turn:
    """One turn of a side: its number in the conversation's turns (warm-up included, from
    1), its sample, whether it compacted (ctxsum: enqueued the compaction; LangGraph:
    summarized), and after a ctxsum turn that did, the worker's run of the compaction task
    and of the check it deferred, with the tasks' outcomes."""

    side: str
    number: int
    round: int
    sample: Sample
    compacted: bool
    task: Sample | None = None
    check: Sample | None = None
    outcomes: list[str] = field(default_factory=list)

    def samples(self) -> list[Sample]:
        """Everything timed for this turn: the turn, and the background runs after it."""
        return [sample for sample in (self.sample, self.task, self.check) if sample is not None]

    def background(self) -> dict[str, float] | None:
        """The background runs' figures, added up (None: there were none)."""
        runs = [sample.figures() for sample in (self.task, self.check) if sample is not None]
        if not runs:
            return None
        return {figure: sum(run[figure] for run in runs) for figure in runs[0]}


@dataclass
class Thread:
    """One history length on both sides: ctxsum's conversation and the messages LangGraph's
    thread was built with, how many turns each side has made (warm-up included), and the
    measured ones."""

    size: int
    built: Built
    langgraph_history: int
    made: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIDES, 0))
    turns: dict[str, list[Turn]] = field(default_factory=lambda: {side: [] for side in SIDES})


def timed_ctxsum_turn(thread: Thread, clocks: Clocks, number: int, round_: int) -> Turn:
    """A ctxsum turn, then, when it enqueued the compaction, the worker's run of it and of
    the check it defers (made due at once, untimed)."""
    from django.utils import timezone

    from bench.turn_sides import checks_due, ctxsum_turn, run_worker, task_outcomes

    queued, sample = clocks.timed(lambda: ctxsum_turn(thread.built))
    turn = Turn("ctxsum", number, round_, sample, compacted=queued)
    if queued:
        since = timezone.now()
        _, turn.task = clocks.timed(run_worker)
        checks_due()
        _, turn.check = clocks.timed(run_worker)
        turn.outcomes = task_outcomes(since)
    return turn


def timed_langgraph_turn(
    thread: Thread, clocks: Clocks, agent: Agent, number: int, round_: int
) -> Turn:
    from bench.turn_sides import langgraph_turn

    summarized, sample = clocks.timed(lambda: langgraph_turn(agent, thread.size))
    return Turn("LangGraph", number, round_, sample, compacted=summarized)


def turns(
    thread: Thread, clocks: Clocks, agent: Agent, *, count: int, round_: int, first: str
) -> list[Turn]:
    """``count`` turns on each side of ``thread``, alternating, ``first`` side first."""
    made: list[Turn] = []
    order = SIDES if first == SIDES[0] else SIDES[::-1]
    for _ in range(count):
        for side in order:
            thread.made[side] += 1
            number = thread.made[side]
            if side == "ctxsum":
                turn = timed_ctxsum_turn(thread, clocks, number, round_)
            else:
                turn = timed_langgraph_turn(thread, clocks, agent, number, round_)
            made.append(turn)
    return made


def build(args: argparse.Namespace, agent: Agent, runs: Any, system: str) -> list[Thread]:
    """Every size on both sides, each followed by ANALYZE and CHECKPOINT."""
    from bench.common import bench_owner
    from bench.scaling_state import settle
    from bench.turn_sides import ctxsum_build, langgraph_build

    owner = bench_owner("ctxsum-vs-langgraph")
    threads = []
    for size in args.sizes:
        built = ctxsum_build(owner=owner, system=system, runs=runs, size=size)
        history = langgraph_build(agent, runs=runs, size=size)
        settle()
        threads.append(Thread(size=size, built=built, langgraph_history=history))
        progress(f"built {size}: ctxsum {built.history} messages, LangGraph {history}")
    return threads


def measure(
    args: argparse.Namespace, threads: list[Thread], clocks: Clocks, agent: Agent, *, wal: bool
) -> Written | None:
    """The warm-up, then the rounds; after each round, when ``wal`` (it can be read here),
    what its turns wrote, from the WAL (kept until then: ``reserved``). What the WAL holds
    of this database between the timed stretches (``attribute``), or None."""
    from bench.turn_clocks import read_writes
    from bench.wal_writes import relations, reserved

    for thread in threads:
        turns(thread, clocks, agent, count=args.warm_up, round_=-1, first=SIDES[0])
    rels = relations()
    between = Written() if wal else None
    for number in range(args.rounds):
        gc.collect()
        samples: list[Sample] = []
        shift = number % len(threads)
        with reserved() if between else contextlib.nullcontext():
            for thread in [*threads[shift:], *threads[:shift]]:
                first = SIDES[number % 2]
                made = turns(thread, clocks, agent, count=args.turns, round_=number, first=first)
                for turn in made:
                    thread.turns[turn.side].append(turn)
                    samples.extend(turn.samples())
            if between is not None:
                between.merge(read_writes(samples, rels))
        progress(f"round {number + 1}/{args.rounds}")
    return between


def run(args: argparse.Namespace, url: str, system: str, runs: Any) -> dict[str, Any]:
    """Build, measure and report on the database ``url`` (Django set up on it), with
    ``system`` as the system message and ``runs``' messages as the history."""
    from bench.turn_clocks import backend_pid
    from bench.turn_report import report_fields
    from bench.turn_sides import kept_connection, langgraph_agent
    from bench.wal_writes import available

    wal = available()
    with kept_connection(), langgraph_agent(url, system) as agent:
        threads = build(args, agent, runs, system)
        clocks = Clocks([backend_pid(), agent.saver.conn.info.backend_pid])
        between = measure(args, threads, clocks, agent, wal=wal)
        return report_fields(args, threads, between)


def main(argv: Sequence[str] | None = None) -> int:
    from bench.command import Run
    from bench.common import disposable_database, setup_django
    from bench.prepare_state import agent_pool
    from bench.turn_report import tables

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.tables_from is not None:
        print("\n".join(tables(json.loads(args.tables_from.read_text(encoding="utf-8")))))
        return 0
    started = Run("vs_langgraph", argv)
    with disposable_database(args.database_url), tempfile.TemporaryDirectory() as tmp:
        setup_django(database_url=args.database_url, sqlite_dir=Path(tmp), ctxsum=CTXSUM)
        try:
            system, runs = agent_pool(args.data_dir)
            fields = run(args, args.database_url, system, runs)
        finally:
            from django.db import connections

            connections.close_all()
    return started.finish({**fields, "policy": POLICY}, args, draw=lambda report: [], lines=tables)


if __name__ == "__main__":
    sys.exit(main())
