"""Django for a replay outside the test runner: the example project's settings, the
replay's own database, the offline summarizer, no automatic compaction. Importing it does
not configure Django; ``setup_django`` does, once per process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.support.shared import use_tiktoken_cache

OFFLINE_SUMMARIZER = "ctxsum.summarizers.offline.OfflineSummarizer"
SQLITE_FAST = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"


def replay_database(
    *, database_url: str | None, sqlite_dir: Path, sqlite_fsync: bool = False
) -> dict[str, Any]:
    """The DATABASES entry: ``database_url`` parsed, else a new SQLite file in
    ``sqlite_dir``.

    The SQLite file runs in WAL mode with synchronous=NORMAL (no fsync per commit) unless
    ``sqlite_fsync``: SQLite's defaults cost an fsync per transaction, which on a slow disk
    is ~20 ms and would measure the disk, not ctxsum."""
    if database_url:
        import environ

        return environ.Env.db_url_config(database_url)
    sqlite_dir.mkdir(parents=True, exist_ok=True)
    database: dict[str, Any] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(sqlite_dir / "replay.db"),
    }
    if not sqlite_fsync:
        database["OPTIONS"] = {"init_command": SQLITE_FAST}
    return database


def setup_django(
    *, database_url: str | None, sqlite_dir: Path, sqlite_fsync: bool = False, migrate: bool = True
) -> None:
    """Configure Django for the replay: the example project's settings, the given database
    (else a new SQLite file in ``sqlite_dir``), the offline summarizer; then migrate."""
    use_tiktoken_cache()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

    import django
    from django.conf import settings

    settings.DATABASES = {
        "default": replay_database(
            database_url=database_url, sqlite_dir=sqlite_dir, sqlite_fsync=sqlite_fsync
        )
    }
    # DEBUG would keep every query in memory; the replay captures the ones it counts.
    settings.DEBUG = False
    # The replay compacts after every append itself: no automatic compaction on top.
    settings.CTXSUM = {
        **(getattr(settings, "CTXSUM", None) or {}),
        "SUMMARIZER": OFFLINE_SUMMARIZER,
        "AUTO_COMPACT": False,
    }
    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def close_connections() -> None:
    """Close this process's database connections (before its SQLite file goes away)."""
    from django.db import connections

    connections.close_all()
