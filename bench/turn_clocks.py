"""The clocks around one stretch of work of ``bench.vs_langgraph`` (a turn, or a background
compaction): this process's CPU time (``time.process_time_ns``: every thread, LangGraph's
checkpoint writer included), the CPU time of the PostgreSQL backends the sides talk to (the
first field of ``/proc/<pid>/schedstat``, nanoseconds; the server runs on this machine), the
wall time (``time.perf_counter_ns``), and the WAL positions before and after, from which
bench/wal_writes.py tells what the work wrote. Reading the clocks is not timed."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.wal_writes import Relations, Written, attribute, current_lsn, lsn


@dataclass
class Sample:
    """One stretch of work: nanoseconds of this process's CPU, of the servers' CPU and of
    wall time, its WAL window, and (once the WAL is read) what it wrote."""

    cpu_ns: int = 0
    server_ns: int = 0
    wall_ns: int = 0
    windows: list[tuple[str, str]] = field(default_factory=list)
    written: Written = field(default_factory=Written)

    def figures(self) -> dict[str, float]:
        """Microseconds (CPU here, on the server, both, wall) and what it wrote."""
        return {
            "cpu_us": self.cpu_ns / 1000,
            "server_us": self.server_ns / 1000,
            "total_cpu_us": (self.cpu_ns + self.server_ns) / 1000,
            "wall_us": self.wall_ns / 1000,
            "wal_bytes": self.written.wal_bytes,
            "wal_bytes_without_fpi": self.written.wal_bytes - self.written.fpi_bytes,
            "rows": self.written.rows,
        }


def backend_pid() -> int:
    """The PostgreSQL backend process of Django's connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return int(pid)


@dataclass(frozen=True)
class Clocks:
    """The backends whose CPU counts (every connection the sides use)."""

    pids: Sequence[int]

    def server_ns(self) -> int:
        return sum(int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) for pid in self.pids)

    def timed(self, work: Callable[[], Any]) -> tuple[Any, Sample]:
        """Run ``work`` once between the clocks; its result and its sample."""
        start = current_lsn()
        server = self.server_ns()
        wall, cpu = time.perf_counter_ns(), time.process_time_ns()
        result = work()
        cpu, wall = time.process_time_ns() - cpu, time.perf_counter_ns() - wall
        server = self.server_ns() - server
        return result, Sample(cpu, server, wall, [(start, current_lsn())])


def read_writes(samples: Sequence[Sample], rels: Relations) -> Written:
    """Fill in what each sample wrote, from one read of the WAL over all their windows;
    what this database's WAL holds between them."""
    windows = sorted(
        ((window, sample) for sample in samples for window in sample.windows),
        key=lambda pair: lsn(pair[0][0]),
    )
    found, between = attribute([window for window, _ in windows], rels)
    for (_, sample), written in zip(windows, found, strict=True):
        sample.written.merge(written)
    return between
