"""Running the comparison: every side on every conversation, split into jobs (spawned
processes, each with its own Django and SQLite file) when ``jobs`` > 1. Importing it does
not configure Django."""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.replay_data import iter_records

WINDOWS = (6, 12)
PROGRESS_SECONDS = 10.0


@dataclass(frozen=True)
class Options:
    data_dir: Path
    files: tuple[str, ...]
    limit: int | None
    jobs: int
    check: bool
    # ctxsum's side: its summarizer backend and CTXSUM settings over the benchmark's own.
    ctxsum: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Job:
    index: int
    options: Options


def side_names() -> list[str]:
    windows = [f"window_{size}" for size in WINDOWS]
    return ["full", *windows, "langchain", "langchain_in_state", "ctxsum"]


def replay_record(record: Mapping[str, Any], *, owner: Any, check: bool) -> dict[str, Any]:
    """Every side on one conversation (Django is set up): the sides' results by name."""
    from bench.vs_ctxsum import run_ctxsum
    from bench.vs_lc import run_langchain
    from bench.vs_sides import full_history, last_messages, message_counts

    messages = record["messages"]
    counts = message_counts(messages)
    sides = {"full": full_history(messages, counts)}
    for size in WINDOWS:
        sides[f"window_{size}"] = last_messages(messages, counts, size)
    sides["langchain"] = run_langchain(messages, counts, mode="system_prompt")
    sides["langchain_in_state"] = run_langchain(messages, counts, mode="in_state")
    sides["ctxsum"] = run_ctxsum(record, counts, owner=owner, check=check)
    return sides


def run_job(job: Job) -> list[dict[str, Any]]:
    """The job's share of the conversations (every ``jobs``-th), each as a row: its id,
    file, size and every side's result (``SideResult``)."""
    from bench.common import bench_owner, setup_django

    options = job.options
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ctxsum-vs-langchain-") as tmp:
        setup_django(database_url=None, sqlite_dir=Path(tmp), ctxsum=dict(options.ctxsum))
        owner = bench_owner(f"ctxsum-vs-langchain-{job.index}")
        last = time.monotonic()
        records = iter_records(options.data_dir, options.files, limit=options.limit)
        for number, (name, record) in enumerate(records):
            if number % options.jobs != job.index:
                continue
            sides = replay_record(record, owner=owner, check=options.check)
            rows.append(
                {
                    "id": str(record["id"]),
                    "file": name,
                    "messages": len(record["messages"]),
                    "sides": sides,
                }
            )
            if time.monotonic() - last > PROGRESS_SECONDS:
                last = time.monotonic()
                print(f"  job {job.index}: {len(rows)} conversations", flush=True)
        from django.db import connections

        connections.close_all()
    return rows


def run_all(options: Options) -> list[dict[str, Any]]:
    """Every job's rows, in the order of the data."""
    jobs = [Job(index, options) for index in range(options.jobs)]
    if options.jobs == 1:
        return run_job(jobs[0])
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=options.jobs, mp_context=context) as pool:
        results = list(pool.map(run_job, jobs))
    order = {
        (name, str(record["id"])): number
        for number, (name, record) in enumerate(
            iter_records(options.data_dir, options.files, limit=options.limit)
        )
    }
    rows = [row for result in results for row in result]
    return sorted(rows, key=lambda row: order[(row["file"], row["id"])])
