"""A whole replay run: the records split into jobs, the jobs run, their shards merged,
the one-shot probe on the longest record, and the JSON report with what it ran on.
Django is set up in this process (``replay_django.setup_django``) before it is called."""

from __future__ import annotations

import datetime as dt
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.replay_data import iter_records
from tests.support.replay_django import OFFLINE_SUMMARIZER
from tests.support.replay_jobs import Job, JobResult, run_jobs
from tests.support.replay_report import build_report
from tests.support.replay_stats import ReplayStats
from tests.support.run_info import database_info, git_info, load_average, machine_info

BENCH_USER = "ctxsum-bench"  # + run id + job: each run's rows are its own


class ReplayFailed(Exception):
    """The replay stopped at a violation; the message names the conversation and step."""


@dataclass(frozen=True)
class RunOptions:
    """What to replay and how: the command line's choices."""

    data_dir: Path
    files: tuple[str, ...]
    limit: int | None
    check: bool
    check_every: int
    jobs: int
    database_url: str | None
    sqlite_dir: Path
    sqlite_fsync: bool
    probe: bool
    command: str


def plan_jobs(options: RunOptions, *, run_id: str, records: int) -> list[Job]:
    """As many jobs as asked, but no more than there are records (and at least one)."""
    count = min(options.jobs, max(records, 1))
    return [
        Job(
            index=index,
            jobs=count,
            data_dir=options.data_dir,
            files=options.files,
            limit=options.limit,
            check=options.check,
            check_every=options.check_every,
            owner=f"{BENCH_USER}-{run_id}-{index}",
            database_url=options.database_url,
            sqlite_dir=options.sqlite_dir,
            sqlite_fsync=options.sqlite_fsync,
        )
        for index in range(count)
    ]


def merged_stats(results: list[JobResult]) -> ReplayStats:
    """Every job's shard in one ReplayStats; raises ReplayFailed if a job violated."""
    for result in results:
        if result.violation:
            raise ReplayFailed(result.violation)
    stats = ReplayStats()
    for result in results:
        assert result.stats is not None
        stats.merge(result.stats)
    return stats


def probe_longest(records: list[dict[str, Any]], *, run_id: str, check: bool) -> list[dict]:
    """The one-shot compactions of growing size on the longest record (see
    ``replay.query_scaling``); raises ReplayFailed on a violation."""
    from django.contrib.auth import get_user_model

    from tests.support.replay import ReplayViolation, invariant_checker, query_scaling

    owner, _ = get_user_model().objects.get_or_create(username=f"{BENCH_USER}-{run_id}")
    longest = max(records, key=lambda record: len(record["messages"]))
    checker = invariant_checker()[0] if check else None
    try:
        return query_scaling(longest, owner=owner, checker=checker)
    except ReplayViolation as violation:
        raise ReplayFailed(str(violation)) from violation


def describe_run(
    options: RunOptions, *, git: dict[str, Any], jobs: int, checker_source: str | None
) -> dict[str, Any]:
    """The head of the report: when, what command, on what machine, commit and database,
    with which policy and settings."""
    import django

    from ctxsum.conf import ctxsum_settings
    from tests.support.replay import KEEP, TRIGGER

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": options.command,
        "machine": machine_info(),
        "git": git,
        "database": database_info(),
        "django": django.get_version(),
        "jobs": jobs,
        "check": options.check,
        "check_every": options.check_every,
        "invariant_checker": checker_source,
        "policy": {
            "trigger": TRIGGER,
            "keep": KEEP,
            "summarizer": OFFLINE_SUMMARIZER,
            "summary_max_tokens": ctxsum_settings.SUMMARY_MAX_TOKENS,
            "summary_model": ctxsum_settings.SUMMARY_MODEL,
            "target_ratio": ctxsum_settings.TARGET_RATIO,
            "chat_model": ctxsum_settings.DEFAULT_MODEL,
        },
    }


def replay_report(options: RunOptions, *, started: float) -> dict[str, Any]:
    """Replay every record and return the report (``started``: ``time.perf_counter()``
    when the command began, for the setup and wall times). Raises ReplayFailed at the
    first violation."""
    from tests.support.replay import invariant_checker

    setup_seconds = time.perf_counter() - started
    git = git_info()  # at the start: the code the jobs import, not what HEAD is at the end
    load_at_start = load_average()
    records = [
        record for _, record in iter_records(options.data_dir, options.files, limit=options.limit)
    ]
    run_id = uuid.uuid4().hex[:8]
    jobs = plan_jobs(options, run_id=run_id, records=len(records))
    checker_source = invariant_checker()[1] if options.check else None
    print(
        f"[replay] {len(records)} conversations from {', '.join(options.files)} in "
        f"{len(jobs)} job(s); invariant checks: {checker_source or 'off'}",
        file=sys.stderr,
        flush=True,
    )
    replay_started = time.perf_counter()
    results = run_jobs(jobs, len(records))
    replay_seconds = time.perf_counter() - replay_started
    stats = merged_stats(results)
    probe = (
        probe_longest(records, run_id=run_id, check=options.check)
        if options.probe and records
        else []
    )
    # A single job ran in this process: its CPU time is already this process's.
    workers_cpu = sum(result.cpu_seconds for result in results) if len(jobs) > 1 else 0
    return {
        **describe_run(options, git=git, jobs=len(jobs), checker_source=checker_source),
        **build_report(stats),
        "summaries": sum(result.summaries for result in results),
        "query_scaling": probe,
        "load_average_at_start": load_at_start,
        "load_average_at_end": load_average(),
        "cpu_seconds": round(time.process_time() + workers_cpu, 2),
        "setup_seconds": round(setup_seconds, 2),
        "replay_seconds": round(replay_seconds, 2),
        "wall_seconds": round(time.perf_counter() - started, 2),
    }
