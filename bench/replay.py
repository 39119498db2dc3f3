"""Replay the real conversations of ../shared/data through ctxsum, one message at a time.

Every conversation gets a small policy (trigger at 12 messages, keep 6) and the offline
summarizer (deterministic, no network). Each original message is appended on its own with
``message_append`` and ``conversation_compact`` is called after every append. The command
reports what the compact calls did, how much smaller the active context is than the full
history, how many SQL queries a compaction takes and how long appends and compactions
take; the JSON goes to ``--output``.

``--check`` runs the context invariants (tests/invariants.py) after every step (with
``--check-every N``: after every N-th step, every step that compacted and the last one),
treats a context larger than the full history as a violation at every step, and stops at
the first violation with exit status 1, naming the conversation and the step. Every
summarizer call, every compaction's summary metadata and every ``no_gain`` skip are checked
in any case. Exit status 0 means every step held. See bench/README.md.

    python -m bench.replay [--check [--check-every N]] [--limit N] [--files NAME ...]
                           [--data-dir DIR] [--jobs N] [--database-url [URL]] [--sqlite-fsync]
                           [--output PATH] [--no-probe]

This module only parses the command line and writes the results; the replay itself is in
tests/support/ (replay.py steps a conversation, replay_run.py runs them all).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.replay_django import close_connections, setup_django
from tests.support.replay_report import format_report
from tests.support.replay_run import ReplayFailed, RunOptions, replay_report
from tests.support.shared import DATA_DIR, DATA_FILES, REPO_ROOT

RESULTS_DIR = REPO_ROOT / "bench" / "results"
FROM_ENVIRONMENT = "$DATABASE_URL"


def _add_data_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="check the context invariants after every step, and that no context costs more "
        "than the full history; exit 1 on the first violation",
    )
    parser.add_argument(
        "--check-every",
        type=int,
        default=1,
        metavar="N",
        help="with --check, run the invariants after every N-th step, after every step that "
        "compacted and after the last step of each conversation (default 1: every step)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DATA_DIR,
        help=f"directory of the JSONL files (default: {DATA_DIR})",
    )
    parser.add_argument(
        "--files",
        nargs="+",
        default=list(DATA_FILES),
        metavar="NAME",
        help="files of the data directory to replay (default: both)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="replay at most N conversations of each file",
    )


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="replay in N processes, each with its own SQLite file (or all on "
        "the --database-url database); default: the number of CPUs",
    )
    parser.add_argument(
        "--database-url",
        nargs="?",
        const=FROM_ENVIRONMENT,
        default=None,
        metavar="URL",
        help="run on this database instead of throwaway SQLite files; "
        "alone, use $DATABASE_URL. It is migrated and written to.",
    )
    parser.add_argument(
        "--sqlite-fsync",
        action="store_true",
        help="keep SQLite's default journal and synchronous=FULL (an fsync "
        "per commit) instead of WAL with synchronous=NORMAL",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="PATH",
        help="JSON results file (default: bench/results/replay-<date>.json, "
        "with the vendor appended when not SQLite)",
    )
    parser.add_argument(
        "--no-probe", action="store_true", help="skip the one-shot compactions of growing size"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.replay",
        description="Replay the real conversations through ctxsum, compacting after every "
        "append, and report token reduction, queries per compaction and timings.",
    )
    _add_data_options(parser)
    _add_run_options(parser)
    args = parser.parse_args(argv)
    if args.database_url == FROM_ENVIRONMENT:
        args.database_url = os.environ.get("DATABASE_URL")
        if not args.database_url:
            parser.error("--database-url without a URL needs $DATABASE_URL")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.check_every < 1:
        parser.error("--check-every must be at least 1")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def run_options(args: argparse.Namespace, *, sqlite_dir: Path, command: str) -> RunOptions:
    return RunOptions(
        data_dir=args.data_dir,
        files=tuple(args.files),
        limit=args.limit,
        check=args.check,
        check_every=args.check_every,
        jobs=args.jobs,
        database_url=args.database_url,
        sqlite_dir=sqlite_dir,
        sqlite_fsync=args.sqlite_fsync,
        probe=not args.no_probe,
        command=command,
    )


def write_results(report: dict[str, Any], output: Path | None) -> Path:
    """Write the JSON report (by default under bench/results/, named by date and, when not
    SQLite, by vendor) and return where."""
    if output is None:
        vendor = report["database"]["vendor"]
        suffix = "" if vendor == "sqlite" else f"-{vendor}"
        output = RESULTS_DIR / f"replay-{report['date'][:10]}{suffix}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return output


def fail(message: str) -> int:
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    print(f"FAIL: {message}", flush=True)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    command = " ".join([Path(sys.executable).name, "-m", "bench.replay", *argv])
    with tempfile.TemporaryDirectory(prefix="ctxsum-replay-") as tmp:
        sqlite_dir = Path(tmp)
        setup_django(
            database_url=args.database_url,
            sqlite_dir=sqlite_dir / "main",
            sqlite_fsync=args.sqlite_fsync,
        )
        try:
            report = replay_report(
                run_options(args, sqlite_dir=sqlite_dir, command=command), started=started
            )
        except ReplayFailed as failure:
            return fail(str(failure))
        finally:
            close_connections()
    output = write_results(report, args.output)
    print(format_report(report))
    print(f"  results: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
