"""A compaction worker killed during its summarizer call, on PostgreSQL.

A separate process (the example project's settings, the test database, the openai backend
pointed at the local fake server) takes the lease and is held in the summarizer call; the
test SIGKILLs it there. The lease then stays until the lease time has passed, nothing else
has changed, and the next compaction after the lease time takes over and compacts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection
from django.utils import timezone

from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.services import conversation_create
from ctxsum.services.compaction import conversation_compact
from tests.factories import long_user_message, system_message
from tests.invariants import assert_context_invariants
from tests.openai_server import FakeOpenAI
from tests.postgres import POSTGRES, held_openai

pytestmark = POSTGRES

LEASE_SECONDS = 5  # short, yet long enough to see it live on a loaded CI machine
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
        "DJANGO_SETTINGS_MODULE": "project.settings",
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


def test_a_worker_killed_during_the_call_leaves_a_lease_that_expires(user, fake):
    conversation = conversation_create(
        owner=user,
        system=SYSTEM["content"],
        messages=HISTORY,
        trigger={"messages": 5},
        keep={"messages": 1},
    )
    before = counters(conversation)
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

    # Once the lease time has passed, a compaction takes over. Poll: the lease's own
    # timestamp decides, the poll only looks.
    fake.release()
    deadline = time.monotonic() + 2.5 * LEASE_SECONDS
    while True:
        started = timezone.now()
        result = conversation_compact(conversation=conversation, force=True)
        if result.reason != Reason.IN_PROGRESS:
            break
        assert started < expires, "a compaction after the lease time was turned away"
        assert time.monotonic() < deadline, "the abandoned lease was never taken over"
        time.sleep(0.05)
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
