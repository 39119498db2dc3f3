"""Timing the sides of ``bench.prepare_call``: rounds of calls, each call timed on its own
(the reset after it is not), sides interleaved within a round in a rotating order.

Per call: the client process's CPU time (``time.process_time_ns``, everything SQLite and
LangChain do, since both run in this process), the PostgreSQL server process's CPU time
(the first field of ``/proc/<backend pid>/schedstat``, nanoseconds, read around the call;
0 on SQLite), and the wall time (``time.perf_counter_ns``). A round's figure is its mean per
call; a size's figure is the median over rounds, and every ratio is taken round by round
(both sides measured within the same round) and then its median."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import percentile
from bench.prepare_sides import Side

Clock = Callable[[], int]


def no_server() -> int:
    return 0


def postgres_clock() -> Clock:
    """Nanoseconds of CPU the current connection's PostgreSQL backend has used so far."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select pg_backend_pid()")
        (pid,) = cursor.fetchone()
    path = Path(f"/proc/{pid}/schedstat")

    def clock() -> int:
        return int(path.read_text().split()[0])

    return clock


def one_round(side: Side, calls: int, server: Clock) -> dict[str, float]:
    """Mean microseconds per call of ``calls`` calls: client CPU, server CPU, wall."""
    cpu = srv = wall = 0
    gc.collect()
    for _ in range(calls):
        server_before = server()
        wall_before, cpu_before = time.perf_counter_ns(), time.process_time_ns()
        side.call()
        cpu += time.process_time_ns() - cpu_before
        wall += time.perf_counter_ns() - wall_before
        srv += server() - server_before
        side.reset()
    return {
        "cpu_us": cpu / calls / 1000,
        "server_us": srv / calls / 1000,
        "total_cpu_us": (cpu + srv) / calls / 1000,
        "wall_us": wall / calls / 1000,
    }


def measure(
    sides: Sequence[Side], *, rounds: int, calls: dict[str, int], server: Clock
) -> list[dict[str, dict[str, float]]]:
    """``rounds`` rounds; in each, every side once, the order rotated by one each round."""
    results: list[dict[str, dict[str, float]]] = []
    for number in range(rounds):
        order = [*sides[number % len(sides) :], *sides[: number % len(sides)]]
        results.append({side.name: one_round(side, calls[side.name], server) for side in order})
    return results


def medians(results: Sequence[dict[str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Per side: the median over rounds of each figure, with the rounds' values."""
    out: dict[str, dict[str, Any]] = {}
    for name in results[0]:
        out[name] = {}
        for figure in results[0][name]:
            values = [result[name][figure] for result in results]
            out[name][figure] = round(percentile(values, 50), 2)
            out[name][f"{figure}_rounds"] = [round(value, 2) for value in values]
    return out


def ratios(
    results: Sequence[dict[str, dict[str, float]]], numerators: Sequence[str], figure: str
) -> dict[str, float]:
    """Median over rounds of ``numerator / denominator`` for every ctxsum side against every
    other side, on ``figure``."""
    names = list(results[0])
    out: dict[str, float] = {}
    for top in numerators:
        for bottom in names:
            if bottom in numerators:
                continue
            values = [result[top][figure] / result[bottom][figure] for result in results]
            out[f"{top} / {bottom}"] = round(percentile(values, 50), 2)
    return out


def summary_reads(conversation: Any, *, rounds: int, calls: int = 50) -> dict[str, Any]:
    """What the active summary's coverage check would cost a call as the history grows:
    this process's CPU µs for reading the whole active summary row (every column, its
    coverage check included) and the row without the ``coverage_facts`` column, as
    ``context_get`` reads it, median over rounds; and that column's size."""
    import json

    from ctxsum.models import Summary

    active = Summary.objects.filter(conversation=conversation, active=True)
    facts = active.values_list("coverage_facts", flat=True).first() or []
    figures: dict[str, Any] = {"coverage_facts": len(facts), "coverage_json_bytes": 0}
    figures["coverage_json_bytes"] = len(json.dumps(facts))
    for name, read in (("whole_row_us", active.all), ("without_coverage_us", _deferred(active))):
        values = []
        for _ in range(rounds):
            started = time.process_time_ns()
            for _ in range(calls):
                read().first()
            values.append((time.process_time_ns() - started) / calls / 1000)
        figures[name] = round(percentile(values, 50), 1)
    return figures


def _deferred(active: Any) -> Callable[[], Any]:
    return lambda: active.defer("coverage_facts")
