"""The operations ``bench.scaling`` times on every target conversation, and how.

- ``append``: ``services.message_append`` of one user message, the row then deleted and the
  counters restored, untimed (``bench/prepare_state.py``'s ``rewind``), so every call starts
  from the same state;
- ``context``: ``selectors.context_get``, the messages to send;
- ``rest_context``: ``GET /api/conversations/{id}/context/`` through Django's test client,
  logged in as the owner (a session, as a browser or the chat page has): the whole request,
  middleware, authentication, the view and the JSON rendering.

Each timed call is measured on its own with ``time.perf_counter_ns`` (wall time: client and,
on PostgreSQL, the server's work and the round trips). The queries of one more, untimed
call of each are captured with ``CaptureQueriesContext``.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import percentile, summary_of
from bench.prepare_sides import APPENDED
from bench.prepare_state import Built, rewind

OPERATIONS = ("append", "context", "rest_context")


@dataclass
class Target:
    """A built conversation and the name its results go under."""

    name: str
    size: int  # the nominal size: 10, 1,000, ...
    compacted: bool
    built: Built


@dataclass
class Operation:
    name: str
    call: Callable[[], Any]
    reset: Callable[[], None]


def operations(target: Target, client: Any) -> list[Operation]:
    from ctxsum.selectors import context_get
    from ctxsum.services import message_append

    conversation = target.built.conversation
    url = f"/api/conversations/{conversation.pk}/context/"

    def append() -> Any:
        return message_append(conversation=conversation, messages=[dict(APPENDED)])

    def context() -> Any:
        return context_get(conversation=conversation).messages

    def rest_context() -> Any:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}: {response.status_code} {response.content[:200]!r}")
        return response.content

    def nothing() -> None:
        return None

    return [
        Operation("append", append, lambda: rewind(target.built)),
        Operation("context", context, nothing),
        Operation("rest_context", rest_context, nothing),
    ]


def captured(operation: Operation) -> list[str]:
    """The SQL of one call of ``operation`` (untimed)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        operation.call()
    operation.reset()
    return [query["sql"] for query in queries.captured_queries]


def time_calls(operation: Operation, calls: int) -> list[float]:
    """Milliseconds of each of ``calls`` calls (the reset after each untimed)."""
    values = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        operation.call()
        values.append((time.perf_counter_ns() - started) / 1e6)
        operation.reset()
    return values


def measure(
    targets: Sequence[Target],
    client: Any,
    *,
    rounds: int,
    heavy_rounds: int,
    calls: Callable[[Target, str], int],
    heavy: Callable[[Target], bool],
    progress: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """Every operation on every target, ``rounds`` rounds, the targets' order rotated by one
    each round; each target's first call of each operation (a warm-up, untimed) also gives
    its queries. The ``heavy`` targets (reading a whole long history) get their own
    ``heavy_rounds`` rounds after all the others', so that the memory and the database
    cache they churn do not fall on the next target of a round."""
    ops = {target.name: operations(target, client) for target in targets}
    samples: dict[str, dict[str, list[list[float]]]] = {
        target.name: {name: [] for name in OPERATIONS} for target in targets
    }
    queries: dict[str, dict[str, list[str]]] = {}
    for target in targets:
        queries[target.name] = {op.name: captured(op) for op in ops[target.name]}
    groups = {
        "light": ([target for target in targets if not heavy(target)], rounds),
        "heavy": ([target for target in targets if heavy(target)], heavy_rounds),
    }
    for group, (members, count) in groups.items():
        for number in range(count if members else 0):
            order = [*members[number % len(members) :], *members[: number % len(members)]]
            for target in order:
                for op in ops[target.name]:
                    gc.collect()
                    samples[target.name][op.name].append(time_calls(op, calls(target, op.name)))
            progress(f"{group} targets: round {number + 1}/{count}")
    return {
        target.name: {
            name: operation_figures(samples[target.name][name], queries[target.name][name])
            for name in OPERATIONS
        }
        for target in targets
    }


def operation_figures(rounds: Sequence[Sequence[float]], sql: Sequence[str]) -> dict[str, Any]:
    """Median, p95 and mean milliseconds over every call, each round's median, the queries."""
    every = [value for values in rounds for value in values]
    return {
        "ms": summary_of(every, digits=3),
        "round_medians_ms": [round(percentile(values, 50), 3) for values in rounds],
        "queries": len(sql),
        "sql": [statement[:160] for statement in sql],
    }


def ratio(numerator: dict[str, Any], denominator: dict[str, Any]) -> dict[str, float]:
    """``numerator`` over ``denominator``: medians, p95s, and the median of round-by-round
    ratios of the rounds' medians."""
    by_round = [
        top / bottom
        for top, bottom in zip(
            numerator["round_medians_ms"], denominator["round_medians_ms"], strict=False
        )
        if bottom
    ]
    return {
        "median": round(numerator["ms"]["median"] / denominator["ms"]["median"], 3),
        "p95": round(numerator["ms"]["p95"] / denominator["ms"]["p95"], 3),
        "median_of_round_ratios": round(percentile(by_round, 50), 3),
        "extra_queries": numerator["queries"] - denominator["queries"],
    }


def previous_summary_read(
    conversation: Any, *, rounds: int, calls: int = 20
) -> dict[str, Any] | None:
    """What the REST context's ``previous_version`` costs, milliseconds (median over
    rounds): reading the active summary's previous version whole (its coverage check
    included) and its version alone; and the REST answer's serializer
    (``ContextOutputSerializer(context).data``) on what ``context_get`` read, and with that
    previous version read again, version alone. None without a previous one."""
    from ctxsum.api.serializers import ContextOutputSerializer
    from ctxsum.models import Summary
    from ctxsum.selectors import context_get

    active = Summary.objects.filter(conversation=conversation, active=True).first()
    if active is None or active.previous_id is None:
        return None
    previous = Summary.objects.filter(pk=active.previous_id)
    facts = previous.values_list("coverage_facts", flat=True).first() or []
    figures: dict[str, Any] = {"coverage_facts": len(facts), "coverage_json_bytes": 0}
    figures["coverage_json_bytes"] = len(json.dumps(facts))

    def serialize(version_only: bool) -> int:
        context = context_get(conversation=conversation)
        if version_only and context.summary is not None:
            context.summary.previous = previous.only("version").get()
        started = time.perf_counter_ns()
        ContextOutputSerializer(context).data  # noqa: B018 (rendering is the point)
        return time.perf_counter_ns() - started

    def timed(read: Callable[[], Any]) -> int:
        started = time.perf_counter_ns()
        read()
        return time.perf_counter_ns() - started

    probes: dict[str, Callable[[], int]] = {
        "whole_row_ms": lambda: timed(lambda: previous.get()),
        "version_only_ms": lambda: timed(lambda: previous.only("version").get()),
        "serializer_ms": lambda: serialize(False),
        "serializer_version_only_ms": lambda: serialize(True),
    }
    for name, probe in probes.items():
        values = []
        for _ in range(rounds):
            values.append(sum(probe() for _ in range(calls)) / calls / 1e6)
        figures[name] = round(percentile(values, 50), 3)
    return figures
