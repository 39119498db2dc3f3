"""CPU time of one append, in the appending process: ``services.message_append`` of one user
message to one conversation, ``--rounds`` rounds of ``--appends`` appends, each round timed
with ``time.process_time`` (the client's CPU, which the machine's load changes far less than
it changes wall time or throughput). SQLite (a throwaway file, WAL) unless
``--database-url`` names a PostgreSQL database, which is created and dropped.

    python -m bench.append_cpu [--rounds R] [--appends N] [--database-url URL] --output PATH

Results: per round, microseconds of CPU per append; their median. Used with ``bench.ab`` to
compare two checkouts (docs/PERFORMANCE.md, "Before and after the redesign at the seams").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import disposable_database, setup_django, write_json
from tests.support.run_info import git_info, load_average, machine_info

MESSAGE = {"role": "user", "content": "Is flight NW123 on time today, and from which gate? " * 3}


def measure(rounds: int, appends: int) -> list[float]:
    """Microseconds of CPU per append, one figure per round, on a conversation of its own."""
    from bench.common import bench_owner
    from ctxsum.services import conversation_create, message_append

    conversation = conversation_create(owner=bench_owner("ctxsum-append-cpu"), system="Be brief.")
    for _ in range(100):  # warm up: imports, caches, the tokenizer
        message_append(conversation=conversation, messages=[MESSAGE])
    figures = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(appends):
            message_append(conversation=conversation, messages=[MESSAGE])
        figures.append(round((time.process_time() - started) / appends * 1e6, 1))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.append_cpu", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    start = load_average()
    with tempfile.TemporaryDirectory() as scratch, disposable_database(args.database_url):
        setup_django(database_url=args.database_url, sqlite_dir=Path(scratch))
        figures = measure(args.rounds, args.appends)
        from django.db import connections

        connections.close_all()  # before the database is dropped
    report = {
        "benchmark": "append_cpu",
        "database": "postgresql" if args.database_url else "sqlite",
        "git": git_info(),
        "machine": machine_info(),
        "load_average_start": start,
        "load_average_end": load_average(),
        "rounds": figures,
        "median_us": statistics.median(figures),
    }
    write_json(report, args.output)
    print(f"CPU per append: median {report['median_us']} µs over {figures}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
