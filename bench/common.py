"""What the benchmarks of docs/PERFORMANCE.md share: Django set up for a benchmark (its own
database, the fixed-size test summarizer, o200k_base), a throwaway PostgreSQL database, the
facts a result must carry, the percentiles, and where results go (a command's frame around
them is bench/command.py). Importing it does not configure Django."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.support.replay_django import replay_database
from tests.support.run_info import git_info, load_average, machine_info
from tests.support.shared import REPO_ROOT, use_tiktoken_cache

RESULTS_DIR = REPO_ROOT / "bench" / "results"
IMAGES_DIR = REPO_ROOT / "docs" / "images"
ENCODING = "o200k_base"
FIXED_SUMMARIZER = "bench.fixed_summary.FixedSummarizer"
# The summarizers a command's ``--summarizer`` names: the offline backend (summaries that keep
# names, numbers and identifiers, and key facts) or the fixed 120-token summary (no facts).
SUMMARIZERS = {
    "offline": "ctxsum.summarizers.offline.OfflineSummarizer",
    "fixed": FIXED_SUMMARIZER,
}
# The policy both sides get: summarize at 12 messages, keep the last 6 verbatim.
TRIGGER_MESSAGES = 12
KEEP_MESSAGES = 6
# The same policy as a conversation's overrides (``conversation_create(**POLICY)``).
POLICY: dict[str, Any] = {
    "trigger": {"messages": TRIGGER_MESSAGES},
    "keep": {"messages": KEEP_MESSAGES},
}
# PostgreSQL databases a benchmark may drop and create: only ones named for it.
DISPOSABLE_PREFIXES = ("wtbench", "wtperf")
PACKAGES = (
    "django",
    "djangorestframework",
    "django-tasks",
    "django-tasks-db",
    "langchain",
    "langchain-core",
    "langgraph",
    "tiktoken",
    "psycopg",
)


def setup_django(
    *,
    database_url: str | None,
    sqlite_dir: Path,
    migrate: bool = True,
    sqlite_immediate: bool = False,
    ctxsum: Mapping[str, Any] | None = None,
) -> None:
    """Configure Django for a benchmark: the example project's settings, its own database
    (``database_url``, else the SQLite file ``replay.db`` in ``sqlite_dir``, WAL), ctxsum's
    default trigger, the fixed-size summarizer, o200k_base, no automatic compaction, then
    ``ctxsum`` on top;
    then migrate (unless ``migrate`` is false: a second process on the same database).

    ``sqlite_immediate``: SQLite transactions start with ``BEGIN IMMEDIATE`` (Django's
    ``transaction_mode``), so that concurrent writers wait for the write lock instead of
    failing when a read inside the transaction turns into a write."""
    use_tiktoken_cache()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django
    from django.conf import settings

    database = replay_database(database_url=database_url, sqlite_dir=sqlite_dir)
    if sqlite_immediate and not database_url:
        database["OPTIONS"] = {**database.get("OPTIONS", {}), "transaction_mode": "IMMEDIATE"}
    settings.DATABASES = {"default": database}
    settings.DEBUG = False
    from ctxsum.conf import Defaults

    settings.CTXSUM = {
        **(getattr(settings, "CTXSUM", None) or {}),
        # ctxsum's trigger, not the example project's demo one (CTXSUM_TRIGGER_TOKENS).
        "TRIGGER": Defaults.TRIGGER,
        "SUMMARIZER": FIXED_SUMMARIZER,
        "ENCODING": ENCODING,
        "AUTO_COMPACT": False,
        **(ctxsum or {}),
    }
    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def recreate_database(url: str, *, drop_only: bool) -> None:
    """Drop the benchmark's PostgreSQL database (and create it again unless
    ``drop_only``). Only a database named for benchmarks (``DISPOSABLE_PREFIXES``)."""
    import psycopg

    base, name = url.rsplit("/", 1)
    if not name.startswith(DISPOSABLE_PREFIXES):
        allowed = " or ".join(DISPOSABLE_PREFIXES)
        raise SystemExit(f"refusing to drop {name!r}: the database name must start with {allowed}")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as connection:
        connection.execute(f'drop database if exists "{name}"')
        if not drop_only:
            connection.execute(f'create database "{name}"')


@contextlib.contextmanager
def disposable_database(url: str | None) -> Iterator[None]:
    """The PostgreSQL database ``url`` names, created anew for the block and dropped after
    it however the block ends (``recreate_database``); nothing for ``None`` (SQLite)."""
    if url is None:
        yield
        return
    recreate_database(url, drop_only=False)
    try:
        yield
    finally:
        recreate_database(url, drop_only=True)


def bench_owner(name: str) -> Any:
    """A user owning the benchmark's conversations (created once per database)."""
    from django.contrib.auth import get_user_model

    owner, _ = get_user_model().objects.get_or_create(username=name[:150])
    return owner


def versions() -> dict[str, str | None]:
    """Installed versions of the packages the comparison depends on."""
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def run_facts() -> dict[str, Any]:
    """Machine, commit, versions and load: what every result file starts with."""
    return {
        "machine": machine_info(),
        "git": git_info(),
        "versions": versions(),
        "load_average_start": load_average(),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary_of(values: Sequence[float], digits: int = 1) -> dict[str, float | int]:
    """Count, mean, median, p5 and p95 of ``values``."""
    mean = sum(values) / len(values) if values else 0.0
    return {
        "n": len(values),
        "mean": round(mean, digits),
        "median": round(percentile(values, 50), digits),
        "p5": round(percentile(values, 5), digits),
        "p95": round(percentile(values, 95), digits),
    }


def write_json(report: dict[str, Any], output: Path) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return output
