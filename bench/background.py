"""An append's latency while compactions run on the task workers.

Background compaction as a project runs it: ``AUTO_COMPACT`` on, ``COMPACTION_RUNNER =
"tasks"`` with the django-tasks database backend, and ``manage.py db_worker`` processes
(8 by default) on PostgreSQL, all with bench/background_settings.py, whose summarizer waits
10 seconds before it answers (bench/slow_summarizer.py), as a model call would. One user's
conversations reach their trigger: each append that reaches it enqueues a compaction task,
a worker takes it, holds the conversation's lease and waits for the summarizer. Meanwhile
another user appends to a conversation of their own (``services.message_append``, one user
message; the row deleted and the counters restored after each, untimed).

Appends are timed idle (the workers running, nothing queued), then while as many
compactions as workers are in flight (checked from the database around every timed append:
the leases held and the task rows running), then idle again.

    python -m bench.background [--workers N] [--appends N] [--waves N] [--seconds S]
                               [--database-url URL] [--output PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.command import Run, add_command_options, redraw
from bench.common import IMAGES_DIR, POLICY, TRIGGER_MESSAGES, disposable_database, summary_of
from tests.support.shared import DATA_DIR, REPO_ROOT

DEFAULT_DATABASE = "postgres://root@127.0.0.1:5432/wtperf_background"
SETTINGS = "bench.background_settings"
# Seconds to wait for the workers to take the queued compactions, and for them to finish.
PICKUP_TIMEOUT = 30
POLL = 0.05
WARM_UP = 50  # appends before the first timed one


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.background", description=__doc__)
    parser.add_argument("--workers", type=int, default=8, help="db_worker processes (default 8)")
    parser.add_argument(
        "--appends",
        type=int,
        default=1000,
        help="timed appends in each idle phase, and at least as many with every compaction "
        "in flight (default 1000)",
    )
    parser.add_argument(
        "--waves", type=int, default=2, help="waves of compactions, at least (default 2)"
    )
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="the summarizer's wait (default 10)"
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    add_command_options(parser, default_database=DEFAULT_DATABASE, per_database=False)
    return parser.parse_args(argv)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def environment(args: argparse.Namespace) -> dict[str, str]:
    """What the benchmark and its workers share: the settings module, the database, the
    summarizer's wait."""
    from tests.support.shared import use_tiktoken_cache

    use_tiktoken_cache()
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "DATABASE_URL": args.database_url,
        "CTXSUM_BENCH_SUMMARY_SECONDS": str(args.seconds),
        "PYTHONUNBUFFERED": "1",  # the workers' logs as they happen
    }


@dataclass
class Workers:
    """``manage.py db_worker`` processes, each in a process group of its own."""

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def start(self, count: int, env: dict[str, str], log_dir: Path) -> None:
        for index in range(count):
            log = log_dir / f"worker-{index}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "manage.py",
                        "db_worker",
                        "--no-reload",
                        "--worker-id",
                        f"bench-{index}",
                    ],
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.processes.append(process)
            self.logs.append(log)

    def wait_started(self, timeout: float = 60) -> None:
        """Until every worker has logged its start (or raise, with its log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process, log in zip(self.processes, self.logs, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(f"a worker exited: {log.read_text()[-2000:]}")
            if all("Starting worker" in log.read_text() for log in self.logs):
                return
            time.sleep(0.2)
        raise RuntimeError("the workers did not start in time")

    def stop(self) -> None:
        """Terminate every worker's process group; kill what is left after 10 seconds."""
        for process in self.processes:
            if process.poll() is None:
                with_group(process, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with_group(process, signal.SIGKILL)
                process.wait()


def with_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)  # its own session: the group id is its pid


@dataclass
class State:
    """The measured conversation (another user's) and the ones compacted in the background."""

    measured: Any  # prepare_state.Built
    compacting: list[Any]


def build(args: argparse.Namespace) -> State:
    from bench.common import bench_owner
    from bench.prepare_state import COUNTERS, Built, agent_pool, history_stream
    from ctxsum.services import conversation_create

    system, runs = agent_pool(args.data_dir)
    # Below the trigger with the system message and one more append: whole tool rounds.
    block = round_prefix(history_stream(runs, TRIGGER_MESSAGES), TRIGGER_MESSAGES - 2)
    compacting_owner = bench_owner("ctxsum-background-compacting")
    compacting = [
        conversation_create(
            owner=compacting_owner,
            title=f"compacted {index}",
            system=system,
            messages=block,
            **POLICY,
        )
        for index in range(args.workers)
    ]
    started = time.perf_counter()
    measured = conversation_create(
        owner=bench_owner("ctxsum-background-measured"),
        title="measured",
        system=system,
        messages=round_prefix(block, 4),
        **POLICY,
    )
    built = Built(
        conversation=measured,
        history=measured.message_count,
        summaries=0,
        seconds=time.perf_counter() - started,
        counters={name: getattr(measured, name) for name in COUNTERS},
    )
    return State(measured=built, compacting=compacting)


def round_prefix(stream: Sequence[dict[str, Any]], most: int) -> list[dict[str, Any]]:
    """The longest prefix of at most ``most`` messages not followed by a tool result."""
    end = min(most, len(stream))
    while end > 1 and end < len(stream) and stream[end]["role"] == "tool":
        end -= 1
    return list(stream[:end])


def in_flight(state: State) -> tuple[int, int]:
    """Leases held on the compacting conversations, and compaction task rows running."""
    from django_tasks_db.models import DBTaskResult

    from ctxsum.models import Conversation

    ids = [conversation.pk for conversation in state.compacting]
    held = Conversation.objects.filter(pk__in=ids).exclude(lease_owner="").count()
    return held, DBTaskResult.objects.running().count()


def timed_appends(
    state: State, count: int, *, keep_going: Callable[[tuple[int, int]], bool] | None = None
) -> list[dict[str, Any]]:
    """Up to ``count`` timed appends to the measured conversation, each with what was in
    flight just before and just after it (read untimed, the one after an append being the
    one before the next) and the seconds since the first; the rewind after each is untimed.
    Stops early once ``keep_going`` says no to what was in flight after an append."""
    from bench.prepare_sides import APPENDED
    from bench.prepare_state import rewind
    from ctxsum.services import message_append

    conversation = state.measured.conversation
    samples = []
    first = time.perf_counter_ns()
    before = in_flight(state)
    for _ in range(count):
        started = time.perf_counter_ns()
        appended = message_append(conversation=conversation, messages=[dict(APPENDED)])
        elapsed = (time.perf_counter_ns() - started) / 1e6
        after = in_flight(state)
        rewind(state.measured)
        if appended.compaction is None or appended.compaction.reason != "below_trigger":
            raise RuntimeError(f"the measured append was not below its trigger: {appended}")
        at = (started - first) / 1e9
        samples.append(
            {"ms": round(elapsed, 3), "at": round(at, 3), "before": before, "after": after}
        )
        if keep_going is not None and not keep_going(after):
            break
        before = after
    return samples


def until_queued(conversation: Any) -> int:
    """Append user messages until one reaches the trigger and enqueues a compaction; how
    many it took."""
    from bench.prepare_sides import APPENDED
    from ctxsum.services import message_append

    for number in range(1, 3 * TRIGGER_MESSAGES):
        appended = message_append(conversation=conversation, messages=[dict(APPENDED)])
        if appended.compaction is not None and appended.compaction.reason == "queued":
            return number
    raise RuntimeError("no append reached the trigger")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = PICKUP_TIMEOUT) -> float:
    """Poll ``condition`` until true; the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(POLL)
    return time.monotonic() - started


def during(state: State, args: argparse.Namespace) -> dict[str, Any]:
    """Waves of compactions, one per compacting conversation (as many as workers): at least
    ``args.waves``, and until ``args.appends`` appends were timed with all of them in
    flight before and after.

    In each wave appends are timed without a pause from the enqueue until every compaction
    has committed: the ones with every compaction in flight are the ``during`` samples; the
    whole wave (the workers taking the tasks, the commits) is kept as well. A lease is
    released only by its compaction's commit and nothing else is queued, so all held just
    before and just after an append means all held throughout it."""
    from ctxsum.models import CompactionAttempt

    everyone = (args.workers, args.workers)
    compacted = CompactionAttempt.objects.filter(outcome=CompactionAttempt.Outcome.COMPACTED)
    kept: list[dict[str, Any]] = []
    waves: list[dict[str, Any]] = []
    while len(kept) < args.appends or len(waves) < args.waves:
        before = compacted.count()
        appends_to_queue = [until_queued(conversation) for conversation in state.compacting]
        seen = {"everyone": False}
        deadline = time.monotonic() + args.seconds + PICKUP_TIMEOUT

        def unfinished(
            now: tuple[int, int], seen: dict[str, bool] = seen, end: float = deadline
        ) -> bool:
            seen["everyone"] = seen["everyone"] or now == everyone
            return not (seen["everyone"] and now == (0, 0)) and time.monotonic() < end

        samples = timed_appends(state, 10**9, keep_going=unfinished)
        full = [sample for sample in samples if sample["before"] == sample["after"] == everyone]
        kept.extend(full)
        committed = compacted.count() - before
        if committed != args.workers:
            raise RuntimeError(f"{committed} compactions of {args.workers} committed")
        in_window = [sample["at"] for sample in full]
        waves.append(
            {
                "appends_to_queue": appends_to_queue,
                "timed_appends": len(samples),
                "appends_with_all_in_flight": len(full),
                "all_in_flight_from_s": min(in_window, default=None),
                "all_in_flight_until_s": max(in_window, default=None),
                "wave_seconds": samples[-1]["at"] if samples else None,
                "compactions_committed": committed,
                "samples": samples,
            }
        )
        summary = {key: value for key, value in waves[-1].items() if key != "samples"}
        progress(f"wave {len(waves)}: {summary}")
    return {"samples": kept, "waves": waves}


def task_timings() -> dict[str, Any]:
    """From the task rows: seconds from enqueue to start, and from start to finish."""
    from django_tasks_db.models import DBTaskResult

    rows = DBTaskResult.objects.values_list("status", "enqueued_at", "started_at", "finished_at")
    statuses: dict[str, int] = {}
    waits, runs = [], []
    for status, enqueued, started, finished in rows:
        statuses[status] = statuses.get(status, 0) + 1
        if started is not None:
            waits.append((started - enqueued).total_seconds())
        if started is not None and finished is not None:
            runs.append((finished - started).total_seconds())
    return {
        "statuses": statuses,
        "enqueue_to_start_s": summary_of(waits, digits=3),
        "start_to_finish_s": summary_of(runs, digits=3),
    }


def phase_figures(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "ms": summary_of([sample["ms"] for sample in samples], digits=3),
        "max_ms": max(sample["ms"] for sample in samples),
        "samples": list(samples),
    }


def measure(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Everything after Django is set up: build, start the workers, the three phases."""
    from tests.support.run_info import database_info

    state = build(args)
    workers = Workers()
    try:
        workers.start(args.workers, environment(args), log_dir)
        workers.wait_started()
        progress(f"{args.workers} workers started")
        time.sleep(2)  # past the workers' start-up
        timed_appends(state, WARM_UP)  # connections, caches: not measured
        idle = timed_appends(state, args.appends)
        progress("idle: done")
        busy = during(state, args)
        progress("during: done")
        wait_for(lambda: in_flight(state) == (0, 0), "the workers to be idle")
        idle_after = timed_appends(state, args.appends)
        progress("idle again: done")
        if any(sample["before"] != (0, 0) for sample in idle + idle_after):
            raise RuntimeError("a compaction was in flight during an idle phase")
    finally:
        workers.stop()
    phases = {
        "idle": phase_figures(idle),
        "during": phase_figures(busy["samples"]),
        "whole_waves": phase_figures([s for wave in busy["waves"] for s in wave["samples"]]),
        "idle_after": phase_figures(idle_after),
    }
    return {
        "database": database_info(),
        "workers": args.workers,
        "summarizer_seconds": args.seconds,
        "phases": phases,
        "waves": [
            {key: value for key, value in wave.items() if key != "samples"}
            for wave in busy["waves"]
        ],
        "first_wave": busy["waves"][0]["samples"],
        "tasks": task_timings(),
        "during_vs_idle": {
            "median": round(phases["during"]["ms"]["median"] / phases["idle"]["ms"]["median"], 3),
            "p95": round(phases["during"]["ms"]["p95"] / phases["idle"]["ms"]["p95"], 3),
        },
    }


def draw(report: dict[str, Any]) -> list[Path]:
    from bench.plots import background_plot

    return [background_plot(report, IMAGES_DIR / "perf-background.png")]


def summary_lines(report: dict[str, Any]) -> list[str]:
    """Every phase's append latencies, and during over idle."""
    lines = [f"{name}: {phase['ms']}" for name, phase in report["phases"].items()]
    return [*lines, f"during / idle: {report['during_vs_idle']}"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.plots_from is not None:
        return redraw(draw, args.plots_from)
    run = Run("background", argv)
    os.environ.update(environment(args))
    with disposable_database(args.database_url):
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        with tempfile.TemporaryDirectory(prefix="ctxsum-background-") as tmp:
            part = measure(args, Path(tmp))
        from django.db import connections

        connections.close_all()
    return run.finish(part, args, draw=draw, lines=summary_lines)


if __name__ == "__main__":
    sys.exit(main())
