"""The replay split into jobs: every ``jobs``-th conversation to a job, each job in a
process of its own (spawned, with its own Django and its own SQLite file, or all on one
shared database) or, when there is one job, in this process. Progress and results come
back through a queue; the first violation stops every job.

Importing it does not configure Django: a spawned worker imports it first, then sets
Django up for its job."""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.progress import Progress
from tests.support.replay_data import iter_records
from tests.support.replay_django import close_connections, setup_django
from tests.support.replay_stats import ReplayStats


@dataclass(frozen=True)
class Job:
    """One shard of the replay: every ``jobs``-th conversation, from the ``index``-th on."""

    index: int
    jobs: int
    data_dir: Path
    files: tuple[str, ...]
    limit: int | None
    check: bool
    owner: str
    check_every: int = 1
    database_url: str | None = None
    sqlite_dir: Path | None = None
    sqlite_fsync: bool = False


@dataclass
class JobResult:
    """What a job counted, the summaries it wrote, its CPU time, and the violation that
    stopped it (None when every step held)."""

    index: int
    stats: ReplayStats | None = None
    summaries: int = 0
    cpu_seconds: float = 0.0
    violation: str | None = None


def replay_job(job: Job, progress: Callable[[ReplayStats], None] | None = None) -> JobResult:
    """Replay the job's shard (Django is set up). A violation ends it, reported in the
    result."""
    from django.contrib.auth import get_user_model

    from ctxsum.models import Summary
    from tests.support.replay import (
        ReplayViolation,
        erasure_probe,
        invariant_checker,
        replay_conversation,
    )

    owner, _ = get_user_model().objects.get_or_create(username=job.owner)
    checker = invariant_checker()[0] if job.check else None
    stats = ReplayStats()
    result = JobResult(job.index, stats)
    records = iter_records(job.data_dir, job.files, limit=job.limit)
    try:
        for position, (source, record) in enumerate(records):
            if position % job.jobs != job.index:
                continue
            conversation = replay_conversation(
                record,
                owner=owner,
                stats=stats,
                checker=checker,
                source=source,
                check_size=job.check,
                check_every=job.check_every,
            )
            if checker is not None:
                erasure_probe(conversation, record, stats=stats, checker=checker)
            if progress is not None:
                progress(stats)
    except ReplayViolation as violation:
        result.violation = str(violation)
    result.summaries = Summary.objects.filter(conversation__owner=owner).count()
    result.cpu_seconds = time.process_time()
    return result


def _job_process(job: Job, queue: Any) -> None:
    """The body of a worker process: its own Django, its own SQLite file (or the shared
    database), its shard; progress and the result go back through ``queue``."""
    try:
        setup_django(
            database_url=job.database_url,
            sqlite_dir=(job.sqlite_dir or Path(tempfile.gettempdir())) / f"job-{job.index}",
            sqlite_fsync=job.sqlite_fsync,
            migrate=job.database_url is None,  # a shared database was migrated by the parent
        )

        def progress(stats: ReplayStats) -> None:
            queue.put(
                ("progress", job.index, stats.conversations, stats.messages, stats.compactions)
            )

        queue.put(("done", replay_job(job, progress)))
    except BaseException:
        queue.put(("error", job.index, traceback.format_exc()))
        raise
    finally:
        close_connections()


def _counts(stats: ReplayStats) -> tuple[int, int, int]:
    return stats.conversations, stats.messages, stats.compactions


def run_jobs(jobs: Sequence[Job], total: int) -> list[JobResult]:
    """Run the jobs: in this process when there is one, else one spawned process each.
    Stops every job at the first violation. Progress goes to stderr."""
    progress = Progress(total)
    if len(jobs) == 1:
        results = [replay_job(jobs[0], lambda stats: progress.update(*_counts(stats)))]
    else:
        results = _run_processes(jobs, progress)
    done = [_counts(result.stats) for result in results if result.stats is not None]
    conversations, messages, compactions = (sum(column) for column in zip(*done, strict=True))
    progress.update(conversations, messages, compactions, force=True)
    return sorted(results, key=lambda result: result.index)


def _run_processes(jobs: Sequence[Job], progress: Progress) -> list[JobResult]:
    """One spawned process per job; the rest are stopped when one fails or violates."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_job_process, args=(job, queue)) for job in jobs]
    for process in processes:
        process.start()
    results: list[JobResult] = []
    try:
        _collect(queue, processes, jobs, progress, results)
    finally:
        if len(results) < len(jobs) or any(result.violation for result in results):
            for process in processes:
                if process.is_alive():
                    process.terminate()
        for process in processes:
            process.join()
    return results


def _collect(
    queue: Any,
    processes: Sequence[Any],
    jobs: Sequence[Job],
    progress: Progress,
    results: list[JobResult],
) -> None:
    """Read the workers' messages into ``results`` until every job is done or one
    violated; a job that died or raised is an error."""
    counts = {job.index: (0, 0, 0) for job in jobs}
    while len(results) < len(jobs):
        try:
            message = queue.get(timeout=1.0)
        except queue_module.Empty:
            if any(process.exitcode not in (None, 0) for process in processes):
                raise RuntimeError("a replay job died; see its traceback above") from None
            continue
        if message[0] == "progress":
            counts[message[1]] = message[2:]
            progress.update(*(sum(values) for values in zip(*counts.values(), strict=True)))
        elif message[0] == "error":
            raise RuntimeError(f"replay job {message[1]} failed:\n{message[2]}")
        else:
            results.append(message[1])
            if message[1].violation:
                return
