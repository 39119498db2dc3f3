"""Throughput of appends and of compactions with 1, 4 and 8 processes, against the floor.

P operating-system processes (multiprocessing, spawn; each sets Django up with the same
settings on the same database) start together at a barrier and, for a fixed duration, each
appends to its own conversation through ``services.message_append``; appends per second
are summed over the processes. The floor: the same P processes doing the bare transaction
of an append in raw SQL on the same database (``BEGIN``, ``INSERT`` one message row,
``UPDATE`` the conversation's counters, ``COMMIT``). Compactions per second: each process
compacts conversations of its own, prepared before the barrier, with the fixed-size
summarizer. Several rounds; the JSON keeps every round. PostgreSQL and a SQLite file
(WAL, ``BEGIN IMMEDIATE``), each in a process of its own; bench/throughput_worker.py is
one process. Results in docs/PERFORMANCE.md.

    python -m bench.throughput [--processes P ...] [--duration S] [--rounds R]
                               [--database-url URL | --no-postgres] [--output PATH]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.command import add_command_options, backend_django, per_database_main
from bench.common import IMAGES_DIR, percentile, write_json
from tests.support.shared import DATA_DIR

PROCESSES = (1, 4, 8)
DEFAULT_DATABASE = "postgres://root@127.0.0.1:5432/wtperf_throughput"
OWNER = "ctxsum-throughput"
# Messages of history in each conversation to compact (system message aside): over the
# trigger of 12 messages, so a compaction archives all but the last 6.
BLOCK = 24
# Conversations compacted once, in one process, to size each process's supply.
CALIBRATION = 10
WAIT = 600  # seconds a process may take to report


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__)
    parser.add_argument("--processes", type=int, nargs="+", default=list(PROCESSES), metavar="P")
    parser.add_argument(
        "--duration", type=float, default=5.0, help="seconds of each timed phase (default 5)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    add_command_options(parser, default_database=DEFAULT_DATABASE)
    return parser.parse_args(argv)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def calibrate(setup: Any) -> float:
    """Compactions per second of one process alone (Django set up here)."""
    from django.contrib.auth import get_user_model

    from bench.throughput_worker import new_conversation
    from ctxsum.services import conversation_compact

    owner = get_user_model().objects.get(username=setup.owner)
    conversations = [
        new_conversation(setup, owner, "throughput calibration", setup.block)
        for _ in range(CALIBRATION)
    ]
    started = time.perf_counter()
    for conversation in conversations:
        if not conversation_compact(conversation=conversation).compacted:
            raise RuntimeError("calibration: the compaction did not compact")
    return CALIBRATION / (time.perf_counter() - started)


def run_round(
    channels: tuple[Any, Any],
    processes: int,
    args: argparse.Namespace,
    per_process: float,
    number: int,
) -> tuple[dict[str, Any], float]:
    """One round of the three phases (append and floor in turn, then compact) over the
    processes listening on ``channels`` (phases out, results in); the round's figures, and
    the supply rate per process for the next round."""
    from dataclasses import asdict

    from bench.throughput_worker import Phase

    phases, results = channels
    modes = ["append", "floor"] if number % 2 == 0 else ["floor", "append"]
    measured: dict[str, Any] = {}
    for mode in [*modes, "compact"]:
        supply = math.ceil(2 * per_process * args.duration) + 5 if mode == "compact" else 0
        for _ in range(processes):
            phases.put(Phase(mode, args.duration, supply))
        outcomes = [asdict(results.get(timeout=WAIT)[2]) for _ in range(processes)]
        outcomes.sort(key=lambda outcome: outcome["worker"])
        measured[mode] = phase_figures(outcomes, supply)
        if mode == "compact":
            done = [outcome["done"] / outcome["seconds"] for outcome in outcomes]
            per_process = max([per_process, *done])
    measured["append_vs_floor"] = round(
        measured["append"]["per_second"] / measured["floor"]["per_second"], 4
    )
    progress(
        f"P={processes} round {number + 1}: "
        + ", ".join(f"{mode} {measured[mode]['per_second']:,.0f}/s" for mode in modes)
        + f", compact {measured['compact']['per_second']:,.1f}/s"
    )
    return measured, per_process


def run_processes(
    setup: Any, processes: int, args: argparse.Namespace, rate: float
) -> list[dict[str, Any]]:
    """``processes`` processes, ``args.rounds`` rounds of the three phases; per round and
    mode, every process's outcome and the sum of their rates."""
    from bench.throughput_worker import run

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    phases = context.Queue()
    results = context.Queue()
    sqlite = setup.database_url is None
    workers = [
        context.Process(target=run, args=(index, setup, barrier, phases, results, sqlite))
        for index in range(processes)
    ]
    for worker in workers:
        worker.start()
    rounds: list[dict[str, Any]] = []
    try:
        for _ in range(processes):
            kind, index, detail = results.get(timeout=WAIT)
            if kind != "ready":
                raise RuntimeError(f"process {index} failed to start:\n{detail}")
        # The supply: twice what one process alone compacted in the calibration, shared by
        # the processes when they outnumber the CPUs; then twice the best rate seen so far.
        per_process = rate * min(1.0, (os.cpu_count() or 1) / processes)
        for number in range(args.rounds):
            channels = (phases, results)
            measured, per_process = run_round(channels, processes, args, per_process, number)
            rounds.append(measured)
    finally:
        for _ in workers:
            phases.put(None)
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.terminate()
                worker.join()
    return rounds


def phase_figures(outcomes: list[dict[str, Any]], supply: int) -> dict[str, Any]:
    """The sum over processes of what each did per second, and every process's outcome."""
    per_second = sum(outcome["done"] / outcome["seconds"] for outcome in outcomes)
    return {
        "per_second": round(per_second, 2),
        "done": sum(outcome["done"] for outcome in outcomes),
        "errors": sum(outcome["errors"] for outcome in outcomes),
        "exhausted": sum(outcome["exhausted"] for outcome in outcomes),
        "supply_per_process": supply or None,
        "processes": outcomes,
    }


def medians(rounds: list[dict[str, Any]]) -> dict[str, float]:
    figures = {
        mode: round(percentile([result[mode]["per_second"] for result in rounds], 50), 2)
        for mode in ("append", "floor", "compact")
    }
    figures["append_vs_floor"] = round(
        percentile([result["append_vs_floor"] for result in rounds], 50), 4
    )
    return figures


def run_backend(args: argparse.Namespace, setup: Any) -> dict[str, Any]:
    from tests.support.run_info import database_info

    rate = calibrate(setup)
    progress(f"{args.backend}: one process alone compacts {rate:.1f}/s")
    by_processes = {}
    for processes in args.processes:
        rounds = run_processes(setup, processes, args, rate)
        by_processes[str(processes)] = {"median": medians(rounds), "rounds": rounds}
    return {
        "database": {**database_info(), **database_settings()},
        "calibration_compactions_per_second": round(rate, 2),
        "processes": by_processes,
    }


def database_settings() -> dict[str, Any]:
    """The settings that decide what a commit costs."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            names = ("synchronous_commit", "fsync", "wal_sync_method", "max_connections")
            found = {}
            for name in names:
                cursor.execute(f"SHOW {name}")
                found[name] = cursor.fetchone()[0]
            return found
        cursor.execute("PRAGMA journal_mode")
        journal = cursor.fetchone()[0]
        cursor.execute("PRAGMA synchronous")
        return {"journal_mode": journal, "synchronous": cursor.fetchone()[0]}


def backend_main(args: argparse.Namespace) -> int:
    """One backend in this process and its P workers: write its results to ``--part``."""
    from bench.common import bench_owner
    from bench.prepare_state import agent_pool, history_stream
    from bench.throughput_worker import Setup

    with backend_django(args, prefix="ctxsum-throughput-", sqlite_immediate=True) as database:
        system, runs = agent_pool(args.data_dir)
        bench_owner(OWNER)
        setup = Setup(
            database_url=database.url,
            sqlite_dir=database.sqlite_dir,
            owner=OWNER,
            system=system,
            block=history_stream(runs, BLOCK),
        )
        part = run_backend(args, setup)
    write_json(part, args.part)
    return 0


def draw(report: dict[str, Any]) -> list[Path]:
    from bench.plots import throughput_plot

    return [throughput_plot(report["backends"], IMAGES_DIR / "perf-throughput.png")]


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The medians of every database and number of processes."""
    return [
        f"{name} P={processes}: {figures['median']}"
        for name, part in report["backends"].items()
        for processes, figures in part["processes"].items()
    ]


def main(argv: Sequence[str] | None = None) -> int:
    return per_database_main(
        "throughput",
        argv,
        parse_args=parse_args,
        backend_main=backend_main,
        draw=draw,
        options=("duration", "rounds"),
        lines=summary_lines,
    )


if __name__ == "__main__":
    sys.exit(main())
