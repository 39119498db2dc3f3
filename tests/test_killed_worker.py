"""A compaction worker killed during its summarizer call, on PostgreSQL.

A separate process (the example project's settings, the test database, the openai backend
pointed at the local fake server) takes the lease and is held in the summarizer call; the
test SIGKILLs it there. The lease then stays until the lease time has passed, nothing else
has changed, and the next compaction after the lease time takes over and compacts. When
that process is a ``db_worker`` running a background compaction, nobody has to ask again:
the check its task deferred before the call has a second worker compact within one lease
time, with no new append.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection
from django.utils import timezone

from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.services import conversation_create, message_append
from ctxsum.services.compaction import conversation_compact
from tests.factories import long_user_message, system_message
from tests.invariants import assert_context_invariants
from tests.openai_server import FakeOpenAI
from tests.postgres import POSTGRES, held_openai, wait_until

pytestmark = POSTGRES

LEASE_SECONDS = 8  # short, yet long enough for a worker to start on a loaded CI machine
ROOT = Path(__file__).resolve().parents[1]
SYSTEM = system_message("You book trips.")
HISTORY = [long_user_message(f"u{index}") for index in range(6)]
COUNTERS = ("next_seq", "message_count", "active_message_count", "active_tokens", "revision")
# Run in the child: build the summarizer's client first, so that the lease is taken moments
# before the call the test catches in flight.
CHILD = """
import sys
import django

django.setup()
from ctxsum.models import Conversation
from ctxsum.services.compaction import conversation_compact
from ctxsum.summarizers import get_summarizer

get_summarizer().client
conversation_compact(conversation=Conversation.objects.get(pk=sys.argv[1]), force=True)
print("the compaction returned", flush=True)
"""


def database_url() -> str:
    """The URL of the test database this test runs on (test_<name>)."""
    db = connection.settings_dict
    auth = quote(db["USER"] or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    host = db["HOST"] or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{db['NAME']}"


def child_env(fake: FakeOpenAI) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_worker",
        "DATABASE_URL": database_url(),
        "CTXSUM_SUMMARIZER": "openai",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "x",
        "CTXSUM_SUMMARY_TIMEOUT": "30",
        "CTXSUM_LEASE_SECONDS": str(LEASE_SECONDS),
        "NO_PROXY": "127.0.0.1,localhost",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        env["TIKTOKEN_CACHE_DIR"] = os.environ["TIKTOKEN_CACHE_DIR"]
    return env


@pytest.fixture
def fake(settings, monkeypatch):
    yield from held_openai(settings, monkeypatch, lease_seconds=LEASE_SECONDS, timeout=30)


def counters(conversation: Conversation) -> dict[str, Any]:
    return Conversation.objects.filter(pk=conversation.pk).values(*COUNTERS).get()


def kill_child_mid_call(conversation: Conversation, fake: FakeOpenAI) -> None:
    """Run ``CHILD`` on ``conversation`` and SIGKILL it while its summarizer call is held."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(conversation.pk)],
        cwd=ROOT,
        env=child_env(fake),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if not fake.wait_for_in_flight(1, timeout=30):
            child.kill()
            _, stderr = child.communicate(timeout=10)
            pytest.fail(f"the child never called the summarizer:\n{stderr}")
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert "the compaction returned" not in child.stdout.read()
    child.stdout.close()
    child.stderr.close()


def compact_once_expired(conversation: Conversation, expires: datetime) -> Any:
    """Compact until the abandoned lease is taken over, asserting no compaction is turned
    away after ``expires``. Polls: the lease's own timestamp decides, the poll only looks."""
    deadline = time.monotonic() + 2.5 * LEASE_SECONDS
    while True:
        started = timezone.now()
        result = conversation_compact(conversation=conversation, force=True)
        if result.reason != Reason.IN_PROGRESS:
            return result
        assert started < expires, "a compaction after the lease time was turned away"
        assert time.monotonic() < deadline, "the abandoned lease was never taken over"
        time.sleep(0.05)


def test_a_worker_killed_during_the_call_leaves_a_lease_that_expires(user, fake):
    conversation = conversation_create(
        owner=user,
        system=SYSTEM["content"],
        messages=HISTORY,
        trigger={"messages": 5},
        keep={"messages": 1},
    )
    before = counters(conversation)
    kill_child_mid_call(conversation, fake)
    assert len(fake.requests) == 1
    assert "u0: the traveller" in fake.requests[0]["body"]["messages"][-1]["content"]

    # Killed mid-call: the lease stays, nothing else moved.
    conversation.refresh_from_db()
    token, leased_at = conversation.lease_owner, conversation.leased_at
    assert token and leased_at is not None, "the killed worker held no lease"
    expires = leased_at + timedelta(seconds=LEASE_SECONDS)
    assert not Summary.objects.filter(conversation=conversation).exists()
    assert Message.objects.filter(conversation=conversation).active().count() == 7
    assert counters(conversation) == before
    assert not CompactionAttempt.objects.filter(conversation=conversation).exists()
    assert_context_invariants(conversation, original_messages=[SYSTEM, *HISTORY])

    # The lease is live: turned away at once, with no summarizer call.
    started = timezone.now()
    assert started < expires, "too slow to see the lease live: the test machine is overloaded"
    now = conversation_compact(conversation=conversation, force=True)
    assert now.reason == Reason.IN_PROGRESS and not now.compacted
    assert len(fake.requests) == 1
    conversation.refresh_from_db()
    assert (conversation.lease_owner, conversation.leased_at) == (token, leased_at)

    # Once the lease time has passed, a compaction takes over.
    fake.release()
    result = compact_once_expired(conversation, expires)
    assert result.compacted, result.reason
    assert timezone.now() >= expires, "the lease was taken over before it expired"
    assert len(fake.requests) == 2

    conversation.refresh_from_db()
    assert conversation.lease_owner == "" and conversation.leased_at is None
    summary = Summary.objects.get(conversation=conversation)
    assert summary.version == 1 and summary.active
    outcomes = set(
        CompactionAttempt.objects.filter(conversation=conversation).values_list("outcome", "reason")
    )
    assert outcomes == {("skipped", "in_progress"), ("compacted", "compacted")}
    assert_context_invariants(conversation, original_messages=[SYSTEM, *HISTORY])


# A db_worker killed mid-call: its task is lost with it, and its check is not.
DATABASE_TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
WORKER = ["manage.py", "db_worker", "--interval", "0.05", "--no-startup-delay", "--no-reload"]


def start_db_worker(fake: FakeOpenAI, **env_extra: str) -> subprocess.Popen[str]:
    """A real ``manage.py db_worker`` process, talking to ``fake``."""
    env = {**child_env(fake), "CTXSUM_LOG_LEVEL": "WARNING", **env_extra}
    return subprocess.Popen(
        [sys.executable, *WORKER],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def compacted_within(conversation: Conversation, seconds: float) -> bool:
    """Whether the conversation has an active summary within ``seconds`` (polled)."""

    def compacted() -> bool:
        return Summary.objects.filter(conversation=conversation, active=True).exists()

    return wait_until(compacted, timeout=seconds)


def stop_db_worker(worker: subprocess.Popen[str], how: signal.Signals = signal.SIGTERM) -> str:
    if worker.poll() is None:
        worker.send_signal(how)
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
    output = worker.stdout.read() if worker.stdout else ""
    if worker.stdout:
        worker.stdout.close()
    return output


def queued_conversation(user: Any, settings: Any) -> Conversation:
    """A conversation whose last append queued a background compaction for a db_worker."""
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "tasks"}
    settings.TASKS = DATABASE_TASKS
    conversation = conversation_create(
        owner=user,
        system=SYSTEM["content"],
        messages=HISTORY[:4],
        trigger={"messages": 6},
        keep={"messages": 2},
    )
    answer = message_append(conversation=conversation, messages=HISTORY[4:])
    assert answer.compaction.reason == Reason.QUEUED
    return conversation


def assert_the_chain_ended(lost: Any, check: Any, output: str) -> None:
    """Only the killed worker's task is left running. The check compacted, unless it ran in
    the moment between its run_after and the lease's expiry (taken just after it was
    deferred): then it ran again at the expiry. The compaction's own check found nothing."""
    from django_tasks_db.models import DBTaskResult

    check.refresh_from_db()
    assert check.status == "SUCCESSFUL", output
    assert check.return_value["reason"] in ("compacted", "in_progress")
    rows = DBTaskResult.objects.exclude(pk=lost.pk)
    assert set(rows.values_list("status", flat=True)) == {"SUCCESSFUL"}, output
    returned = [row.return_value["reason"] for row in rows.order_by("run_after")]
    assert returned.count("compacted") == 1 and returned[-1] == "below_trigger", returned
    assert set(returned) <= {"compacted", "in_progress", "below_trigger"}, returned
    assert DBTaskResult.objects.get(pk=lost.pk).status == "RUNNING"


def test_a_db_worker_killed_mid_call_has_its_compaction_done_by_another(user, fake, settings):
    from django_tasks_db.models import DBTaskResult

    conversation = queued_conversation(user, settings)
    before = counters(conversation)
    first = start_db_worker(fake)
    try:
        assert fake.wait_for_in_flight(1, timeout=30), "the worker never called the summarizer"
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
    finally:
        stop_db_worker(first, signal.SIGKILL)

    # Killed mid-call: its task stays marked running, its lease stays, nothing else moved;
    # the check its task deferred before the call waits for the lease's expiry.
    conversation.refresh_from_db()
    assert conversation.lease_owner and conversation.leased_at is not None
    expires = conversation.leased_at + timedelta(seconds=LEASE_SECONDS)
    lost = DBTaskResult.objects.get(status="RUNNING")
    check = DBTaskResult.objects.get(status="READY")
    assert lost.args_kwargs["args"] == [str(conversation.pk), "default"]
    assert check.args_kwargs["args"][:2] == [str(conversation.pk), "default"]
    assert lost.started_at < check.run_after <= expires
    assert counters(conversation) == before
    assert not CompactionAttempt.objects.filter(conversation=conversation).exists()
    assert not Summary.objects.filter(conversation=conversation).exists()

    # A second worker, and no new append: the compaction is done once the lease expires.
    fake.release()
    second = start_db_worker(fake)
    try:
        retried = compacted_within(conversation, 4 * LEASE_SECONDS)
        assert retried, "the lost compaction was not retried"
        attempt = CompactionAttempt.objects.get(conversation=conversation)
        assert (attempt.outcome, attempt.reason) == ("compacted", Reason.COMPACTED)
        assert expires <= attempt.created_at < expires + timedelta(seconds=LEASE_SECONDS)

        # Its own check follows one lease time later, finds nothing due, and the chain ends.
        def settled() -> bool:
            pending = DBTaskResult.objects.exclude(pk=lost.pk).exclude(status="SUCCESSFUL")
            return not pending.exists()

        assert wait_until(settled, timeout=4 * LEASE_SECONDS), "a deferred check never ran"
    finally:
        output = stop_db_worker(second)

    assert len(fake.requests) == 2, output
    assert_the_chain_ended(lost, check, output)
    conversation.refresh_from_db()
    assert conversation.lease_owner == "" and conversation.leased_at is None
    assert Message.objects.filter(conversation=conversation).count() == 1 + len(HISTORY)
    assert_context_invariants(conversation, original_messages=[SYSTEM, *HISTORY])


def watch(worker: subprocess.Popen[str]) -> list[str]:
    """Every line ``worker`` prints, as it prints them (read on a thread of its own, so the
    test never blocks on the pipe)."""
    lines: list[str] = []

    def read() -> None:
        assert worker.stdout is not None
        for line in worker.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def printed(lines: list[str], text: str, timeout: float) -> bool:
    return wait_until(lambda: any(text in line for line in list(lines)), timeout=timeout)


def stop_twice_mid_call(fake: FakeOpenAI) -> list[str]:
    """Start a db_worker, and SIGTERM it twice while its summarizer call is held: the first
    lets the task finish, the second stops it inside the call. Returns what it printed."""
    first = start_db_worker(fake)
    try:
        lines = watch(first)
        assert fake.wait_for_in_flight(1, timeout=30), "the worker never called the summarizer"
        first.send_signal(signal.SIGTERM)
        assert printed(lines, "shutting down gracefully", timeout=10), "".join(lines)
        # Python may run the second handler inside the first, before that one has marked the
        # worker stopping: then it counts as a first, and it takes one more.
        for _ in range(3):
            first.send_signal(signal.SIGTERM)
            if printed(lines, "terminating current task", timeout=5):
                break
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)
    return lines


def test_a_db_worker_stopped_twice_mid_call_records_interrupted_and_is_retried(
    user, fake, settings
):
    """A second SIGTERM makes db_worker exit inside the task (SystemExit in the summarizer
    call): the lease is given back, the attempt is recorded as interrupted, the task is
    marked failed, and the check the task deferred compacts once its time has come."""
    from django_tasks_db.models import DBTaskResult

    conversation = queued_conversation(user, settings)
    before = counters(conversation)
    lines = stop_twice_mid_call(fake)

    stopped = DBTaskResult.objects.get(status="FAILED")
    assert stopped.exception_class_path == "builtins.SystemExit", "".join(lines)
    conversation.refresh_from_db()
    assert (conversation.lease_owner, conversation.leased_at) == ("", None)
    assert counters(conversation) == before
    attempt = CompactionAttempt.objects.get(conversation=conversation)
    assert (attempt.outcome, attempt.reason) == ("failed", Reason.INTERRUPTED)
    assert attempt.error.startswith("SystemExit")
    check = DBTaskResult.objects.get(status="READY")
    assert check.run_after > stopped.started_at

    fake.release()
    second = start_db_worker(fake)
    try:
        retried = compacted_within(conversation, 4 * LEASE_SECONDS)
        assert retried, "the interrupted compaction was not retried"
    finally:
        output = stop_db_worker(second)
    assert timezone.now() >= check.run_after
    reasons = CompactionAttempt.objects.filter(conversation=conversation).order_by("id")
    assert list(reasons.values_list("reason", flat=True)) == ["interrupted", "compacted"], output
    assert_context_invariants(conversation, original_messages=[SYSTEM, *HISTORY])
