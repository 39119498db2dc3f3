"""Compaction in real Celery workers through a real Redis broker, on PostgreSQL.

The ``celery`` runner (``CTXSUM["COMPACTION_RUNNER"] = "celery"``) as a project runs it:
worker processes started with ``celery -A tests.celery_app worker`` on the test database,
summarizing over HTTP with the openai backend against a local OpenAI-compatible server
(tests/openai_server.py), and appends made in processes of their own, whose compaction tasks
go through Redis. Each test has a Redis key prefix of its own (kombu's ``global_keyprefix``)
in a database number of the tests' own, so runs side by side never see each other's queue.

- Appends from several processes, to a conversation of their own and to two they share,
  queue their compactions; the worker writes every summary, and every conversation ends
  compacted, satisfying the invariants, with every message appended, in each process's
  order.
- A worker killed during its summarizer call has its compaction done, once, after the lease
  has expired, by the check ctxsum's task deferred before the call (a task with an eta),
  with no new append and no ``acks_late``. When only the pool process dies, the worker still
  holds the check and runs it. When the whole worker dies, the check it had fetched and held
  goes back to the queue after the broker's visibility timeout (Redis keeps unacknowledged
  messages for that long), and a second worker runs it: a project on Redis sets
  ``visibility_timeout`` (docs/how-to/scale-out.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.services import conversation_create
from ctxsum.services.autocompact import compaction_due
from tests.factories import long_user_message, system_message
from tests.invariants import assert_context_invariants
from tests.openai_server import FakeOpenAI, fake_summary, running_fake_openai
from tests.postgres import POSTGRES
from tests.test_killed_worker import child_env

pytestmark = POSTGRES

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_DB = 11  # the tests' own; the key prefix keeps two runs apart inside it
QUEUE = "ctxsum-compaction"
LEASE_SECONDS = 6
# Above LEASE_SECONDS, the furthest eta ctxsum's task defers to: a check a live worker holds
# is never handed to another one; short, so a dead worker's check comes back soon.
VISIBILITY_TIMEOUT = 10
# The model the workers' summaries name (the server answers with the model asked for); the
# appending processes have the offline summarizer, whose summaries name "offline".
WORKER_MODEL = "worker-summary-model"
ROOT = Path(__file__).resolve().parents[1]
SYSTEM = system_message("You book trips.")
POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
APPENDERS = 3
ROUNDS = 8
# Run in an appending process: one message_append per step of the plan (a conversation's
# id and the messages to append), ``pause`` seconds apart, printing the reasons the appends
# answered.
APPEND = """
import json
import sys
import time

import django

django.setup()
import tests.celery_app  # noqa: F401  (as a project's __init__ does: the app tasks go to)
from ctxsum.models import Conversation
from ctxsum.services import message_append

reasons = []
for pk, messages in json.loads(sys.argv[1]):
    answer = message_append(conversation=Conversation.objects.get(pk=pk), messages=messages)
    reasons.append(str(answer.compaction.reason))
    time.sleep(float(sys.argv[2]))
print(json.dumps(reasons), flush=True)
"""


def poll(predicate: Callable[[], bool], timeout: float) -> bool:
    """Whether ``predicate`` holds within ``timeout`` seconds (asked every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@dataclass
class Broker:
    """The test's corner of Redis: every key the workers and the appenders use starts with
    ``prefix``."""

    client: Any
    prefix: str = field(default_factory=lambda: f"ctxsum-test-{uuid.uuid4().hex[:12]}:")

    def env(self) -> dict[str, str]:
        transport = {
            "global_keyprefix": self.prefix,
            "visibility_timeout": VISIBILITY_TIMEOUT,
            # Look for messages past their visibility timeout every second (kombu's default
            # sweep is every 100 s), so a dead worker's check comes back on time.
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
        return {
            "CTXSUM_TEST_CELERY_BROKER": f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}",
            "CTXSUM_TEST_CELERY_TRANSPORT": json.dumps(transport),
            "CTXSUM_TEST_CELERY_QUEUE": QUEUE,
        }

    def waiting(self) -> int:
        """Messages in the queue, fetched by no worker."""
        return int(self.client.llen(self.prefix + QUEUE))

    def held(self) -> int:
        """Messages a worker fetched and has not acknowledged (an eta task waiting in it)."""
        return int(self.client.hlen(self.prefix + "unacked"))


@pytest.fixture
def broker() -> Iterator[Broker]:
    redis = pytest.importorskip("redis")
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB, socket_timeout=5)
    try:
        client.ping()
    except redis.exceptions.RedisError as error:
        pytest.skip(f"needs Redis on {REDIS_HOST}:{REDIS_PORT} (.ci/run starts it): {error}")
    corner = Broker(client)
    yield corner
    keys = list(client.scan_iter(match=corner.prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


class Processes:
    """The Celery workers and appending processes a test starts, each in a process group
    of its own: whatever is still running at the end is killed, group and all."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[str]] = []

    def worker(self, name: str, env: dict[str, str], *, concurrency: int = 1) -> Worker:
        """A ``celery worker`` (prefork pool, as Celery runs by default) on the test's
        queue, logging to a file of its own."""
        log = self.logs / f"{name}.log"
        command = [
            *(sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker"),
            *("--pool", "prefork", "--concurrency", str(concurrency), "--queues", QUEUE),
            *("--hostname", f"{name}@%h", "--loglevel", "INFO"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ]
        with log.open("w") as output:
            process = self._start(command, env, stdout=output)
        return Worker(process, log)

    def append(
        self, plan: list[tuple[str, list[dict[str, Any]]]], env: dict[str, str], pause: float = 0
    ) -> Any:
        """An appending process running ``plan``; ``.communicate()`` waits for it."""
        command = [sys.executable, "-c", APPEND, json.dumps(plan), str(pause)]
        return self._start(command, env, stdout=subprocess.PIPE)

    def _start(self, command: list[str], env: dict[str, str], stdout: Any) -> Any:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout is not subprocess.PIPE else subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.started.append(process)
        return process

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@dataclass
class Worker:
    process: subprocess.Popen[str]
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    def ready(self, timeout: float = 60) -> bool:
        """Whether the worker says it is ready within ``timeout`` seconds."""
        return poll(lambda: " ready." in self.output(), timeout)

    def received(self) -> int:
        """Compaction tasks the worker took from the broker (its log says so at INFO)."""
        lines = self.output().splitlines()
        return sum("ctxsum.compact_conversation[" in line and "received" in line for line in lines)

    def pool_process(self) -> int:
        """The pid of the worker's one pool process: the one that runs the task."""
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == self.process.pid:
                children.append(int(stat.parent.name))
        assert len(children) == 1, (children, self.output())
        return children[0]

    def stop(self) -> str:
        """A warm shutdown (SIGTERM): the worker ends its task and gives back what it held."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        return self.output()


@pytest.fixture
def processes(broker: Broker, tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    yield started
    started.close()


@pytest.fixture
def server(monkeypatch: Any) -> Iterator[FakeOpenAI]:
    """The workers' summarizer; a held call waits at most 60 s for ``release()``."""
    with running_fake_openai(monkeypatch, delay=60) as fake:
        yield fake


def worker_env(fake: FakeOpenAI, broker: Broker) -> dict[str, str]:
    return {
        **child_env(fake),
        **broker.env(),
        "DJANGO_SETTINGS_MODULE": "tests.settings_celery",
        "CTXSUM_COMPACTION_RUNNER": "celery",
        "CTXSUM_LEASE_SECONDS": str(LEASE_SECONDS),
        "CTXSUM_SUMMARY_MODEL": WORKER_MODEL,
        "CTXSUM_LOG_LEVEL": "WARNING",
    }


def appender_env(fake: FakeOpenAI, broker: Broker) -> dict[str, str]:
    """An appending process never summarizes: were it to, its summary would name "offline"."""
    return {**worker_env(fake, broker), "CTXSUM_SUMMARIZER": "offline"}


def appended(process: Any) -> list[str]:
    """The reasons an appending process's appends answered, once it has ended."""
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    reasons: list[str] = json.loads(stdout.strip().splitlines()[-1])
    return reasons


def new_conversation(owner: Any, tag: str) -> tuple[Conversation, list[dict[str, Any]]]:
    """A conversation below its trigger, and the messages it was created with."""
    first = [long_user_message(f"{tag}-start-{index}") for index in range(2)]
    conversation = conversation_create(
        owner=owner, system=SYSTEM["content"], messages=first, **POLICY
    )
    return conversation, first


def transcript(conversation: Conversation) -> list[str]:
    """The content of the conversation's messages after the system prompt, in seq order."""
    rows = Message.objects.filter(conversation=conversation, seq__gt=0).order_by("seq")
    return list(rows.values_list("content", flat=True))


def in_order(sent: list[str], stored: list[str]) -> bool:
    """Whether ``sent`` appears in ``stored`` in its own order."""
    rest = iter(stored)
    return all(text in rest for text in sent)


def settled(conversations: list[Conversation]) -> bool:
    """No compaction work due and none running, in any of ``conversations``."""
    rows = Conversation.objects.filter(pk__in=[c.pk for c in conversations])
    return all(not compaction_due(row) and not row.lease_owner for row in rows)


def test_appends_from_several_processes_are_compacted_by_the_worker(
    user, server, broker, processes
):
    owned = [new_conversation(user, f"own{index}") for index in range(APPENDERS)]
    shared = [new_conversation(user, f"shared{index}") for index in range(2)]
    worker = processes.worker("worker", worker_env(server, broker), concurrency=2)

    # Each process appends one message at a time, in turn to its own conversation and to
    # each shared one.
    sent: dict[tuple[int, str], list[str]] = {}
    plans = []
    for number, (own, _) in enumerate(owned):
        plan = []
        for step in range(ROUNDS):
            for conversation, _ in [(own, None), *shared]:
                message = long_user_message(f"p{number}-c{conversation.pk}-m{step}")
                sent.setdefault((number, str(conversation.pk)), []).append(message["content"])
                plan.append((str(conversation.pk), [message]))
        plans.append(plan)
    assert worker.ready(), worker.output()
    env = appender_env(server, broker)
    appenders = [processes.append(plan, env, pause=0.05) for plan in plans]
    answers = [reason for process in appenders for reason in appended(process)]

    # No append compacted in its own process: each one over the trigger queued a task.
    assert set(answers) == {Reason.BELOW_TRIGGER, Reason.QUEUED}, answers
    queued = answers.count(Reason.QUEUED)
    everything = [conversation for conversation, _ in owned + shared]

    # Every task queued reached the worker through Redis, and left nothing due.
    def done() -> bool:
        return broker.waiting() == 0 and worker.received() >= queued and settled(everything)

    assert poll(done, timeout=6 * LEASE_SECONDS), worker.output()
    worker.stop()

    summaries = Summary.objects.filter(conversation__in=everything)
    assert summaries.exclude(model=WORKER_MODEL).count() == 0, "an appender summarized"
    # Compactions ran while the appends went on: some conversation compacted more than once.
    assert summaries.count() > len(everything)
    outcomes = CompactionAttempt.objects.filter(conversation__in=everything)
    assert set(outcomes.values_list("outcome", flat=True)) <= {"compacted", "skipped", "conflict"}
    # A task starved of the CPU past its lease (a loaded machine) loses it to another, which
    # compacts the same range: the loser's call is written nowhere, its attempt a conflict.
    # Every summarizer call is a summary, or an attempt that wrote none.
    lost = outcomes.filter(outcome="conflict") | outcomes.filter(reason=Reason.NO_GAIN)
    assert len(server.requests) == summaries.count() + lost.count()
    for attempt in outcomes.filter(outcome="conflict"):
        taken = Message.objects.filter(
            conversation=attempt.conversation,
            seq__range=(attempt.from_seq, attempt.to_seq),
            summary__isnull=True,
        )
        assert not taken.exists(), "a range lost in a race was left uncompacted"
    for conversation, first in owned + shared:
        stored = transcript(conversation)
        texts = [message["content"] for message in first]
        for number in range(APPENDERS):
            texts += sent.get((number, str(conversation.pk)), [])
            assert in_order(sent.get((number, str(conversation.pk)), []), stored)
        assert sorted(stored) == sorted(texts), "a message was lost or stored twice"
        assert Summary.objects.filter(conversation=conversation, active=True).exists()
        active = Summary.objects.get(conversation=conversation, active=True)
        assert active.text.startswith("Summary of")
        originals = [SYSTEM, *({"role": "user", "content": text} for text in stored)]
        assert_context_invariants(conversation, original_messages=originals)


@pytest.fixture
def held(server: FakeOpenAI) -> FakeOpenAI:
    """The summarizer's server holding every call until ``release()``."""
    server.mode = "hold"
    return server


@pytest.mark.parametrize("killed", ["pool process", "worker"])
def test_a_worker_killed_mid_call_has_its_compaction_done_once(
    user, held, broker, processes, killed
):
    conversation, first = new_conversation(user, "killed")
    more = [long_user_message(f"killed-{index}") for index in range(4)]
    env = worker_env(held, broker)
    worker = processes.worker("first", env)
    began = timezone.now()
    plan = [(str(conversation.pk), more)]
    [reason] = appended(processes.append(plan, appender_env(held, broker)))
    assert reason == Reason.QUEUED
    assert held.wait_for_in_flight(1, timeout=60), worker.output()
    # Before its call, the task deferred its check: the worker fetched that eta task and
    # holds it, unacknowledged, till its time comes.
    assert poll(lambda: broker.waiting() == 0 and broker.held() == 1, timeout=10), (
        broker.waiting(),
        broker.held(),
    )

    if killed == "pool process":
        os.kill(worker.pool_process(), signal.SIGKILL)
    else:
        os.killpg(worker.process.pid, signal.SIGKILL)
        assert worker.process.wait(timeout=10) == -signal.SIGKILL

    # Killed mid-call: the lease stays, nothing was written.
    conversation.refresh_from_db()
    assert conversation.lease_owner and conversation.leased_at is not None
    expires = conversation.leased_at + timedelta(seconds=LEASE_SECONDS)
    assert not Summary.objects.filter(conversation=conversation).exists()
    assert not CompactionAttempt.objects.filter(conversation=conversation).exists()
    held.release()
    if killed == "worker":
        # The check went down with the worker, still held: only the visibility timeout
        # gives it back to the queue, where a second worker takes it.
        assert broker.held() == 1 and broker.waiting() == 0
        processes.worker("second", env)

    def compacted() -> bool:
        return Summary.objects.filter(conversation=conversation, active=True).exists()

    timeout = VISIBILITY_TIMEOUT + 3 * LEASE_SECONDS + 20
    assert poll(compacted, timeout=timeout), worker.output()
    attempt = CompactionAttempt.objects.get(conversation=conversation)
    assert (attempt.outcome, attempt.reason) == ("compacted", Reason.COMPACTED)
    assert attempt.created_at >= expires, "the lease was taken over before it expired"
    if killed == "worker":
        assert attempt.created_at >= began + timedelta(seconds=VISIBILITY_TIMEOUT)
    summary = Summary.objects.get(conversation=conversation)
    assert (summary.version, summary.active, summary.model) == (1, True, WORKER_MODEL)
    assert len(held.requests) == 2
    texts = [message["content"] for message in more]
    assert held.bodies[0] == held.bodies[1]
    assert summary.text == fake_summary(held.bodies[1]["messages"][-1]["content"])
    conversation.refresh_from_db()
    assert (conversation.lease_owner, conversation.leased_at) == ("", None)
    assert transcript(conversation) == [message["content"] for message in first] + texts
    assert_context_invariants(conversation, original_messages=[SYSTEM, *first, *more])
