"""What the PostgreSQL concurrency tests share: their marks, worker threads on connections
of their own, and a local OpenAI-compatible server that holds every summarizer call until
the test releases it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from ctxsum.models import CompactionAttempt, Conversation
from ctxsum.services.compaction import conversation_compact
from tests.openai_server import FakeOpenAI, running_fake_openai

POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL row locks; set DATABASE_URL",
    ),
    pytest.mark.django_db(transaction=True),
]
SAFETY_NET = 15  # seconds a held summarizer call waits at most for release()


def held_openai(
    settings: Any, monkeypatch: Any, *, lease_seconds: float, timeout: float = 20
) -> Iterator[FakeOpenAI]:
    """CTXSUM pointed, through the real openai backend, at a server in "hold" mode; for a
    fixture to ``yield from``."""
    with running_fake_openai(monkeypatch, mode="hold", delay=SAFETY_NET) as server:
        settings.CTXSUM = {
            **getattr(settings, "CTXSUM", {}),
            "SUMMARIZER": "ctxsum.summarizers.openai.OpenAISummarizer",
            "SUMMARIZER_OPTIONS": {"base_url": server.base_url, "api_key": "test"},
            "SUMMARY_TIMEOUT": timeout,
            "LEASE_SECONDS": lease_seconds,
        }
        yield server


class Worker(threading.Thread):
    """Runs ``work`` on its own connection; ``pid`` is that connection's backend, known
    once ``started`` is set; ``outcome()`` joins and returns or re-raises."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None
        self.pid: int | None = None
        self.started = threading.Event()

    def run(self) -> None:
        try:
            self.pid = backend_pid()
            self.started.set()
            self.result = self.work()
        except BaseException as error:
            self.error = error
        finally:
            self.started.set()
            connection.close()

    def outcome(self, timeout: float = 30) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "the worker did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def start(work: Callable[[], Any]) -> Worker:
    worker = Worker(work)
    worker.start()
    assert worker.started.wait(10)
    return worker


def compact_in_thread(conversation: Conversation, **kwargs: Any) -> Worker:
    pk = conversation.pk
    return start(
        lambda: conversation_compact(conversation=Conversation.objects.get(pk=pk), **kwargs)
    )


def compact_held(conversation: Conversation, fake: FakeOpenAI, **kwargs: Any) -> Worker:
    """Compact ``conversation`` in a worker and return once its summarizer call is in
    flight, held by ``fake`` (in "hold" mode) until ``fake.release()``."""
    worker = compact_in_thread(conversation, **kwargs)
    assert fake.wait_for_in_flight(1, timeout=10), "the summarizer call never started"
    return worker


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def blocked(pid: int | None) -> bool:
    """Whether the backend ``pid`` waits for a lock another backend holds (a live view,
    unlike pg_stat_activity, which keeps one snapshot per transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT cardinality(pg_blocking_pids(%s))", [pid])
        return cursor.fetchone()[0] > 0


def wait_until(predicate: Callable[[], bool], timeout: float = 10) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def attempts(conversation: Conversation) -> list[tuple[str, str]]:
    rows = CompactionAttempt.objects.filter(conversation=conversation)
    return sorted(rows.values_list("outcome", "reason"))
