"""Compaction against concurrent workers, on PostgreSQL row locks.

Each worker is a thread with its own database connection (closed when it ends), the way
separate processes share one database. The summarizer is the real OpenAI backend talking to
a local fake server whose "hold" mode keeps a call in flight until the test releases it: the
test acts meanwhile, with no sleep to tune.

- a slow summary never blocks an append, and what was appended meanwhile stays active;
- concurrent compactions of one conversation write exactly one summary;
- a stale lease is taken over, a fresh one turns a compaction away without an LLM call;
- a snapshot that changed during the LLM call is a conflict: nothing written, nothing lost.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from ctxsum.models import CompactionAttempt, Conversation, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import context_get, summary_message
from ctxsum.services.compaction import conversation_compact
from ctxsum.services.conversations import conversation_create
from ctxsum.services.messages import message_append
from tests.factories import system_message, user_message, weather_history
from tests.invariants import assert_context_invariants
from tests.postgres import (
    POSTGRES,
    SAFETY_NET,
    Worker,
    attempts,
    compact_held,
    held_openai,
    wait_until,
)

pytestmark = POSTGRES
LEASE_SECONDS = 30
SYSTEM = system_message()
HISTORY = weather_history()
ORIGINAL = [SYSTEM, *HISTORY]  # system + 7 messages: over a trigger of 6


@pytest.fixture
def fake(settings, monkeypatch):
    yield from held_openai(settings, monkeypatch, lease_seconds=LEASE_SECONDS)


@pytest.fixture
def conversation(user):
    return conversation_create(
        owner=user,
        system=SYSTEM["content"],
        messages=HISTORY,
        trigger={"messages": 6},
        keep={"messages": 2},
    )


def test_appends_do_not_wait_for_a_slow_summary(conversation, fake):
    worker = compact_held(conversation, fake)

    appended = [
        user_message(f"While you summarize: note {index}, gate B{index}.") for index in range(5)
    ]
    started = time.monotonic()
    for message in appended:
        message_append(conversation=conversation, messages=[message])
    # The call is held until release(): the appends finished while it was in flight. A lock
    # wait would have lasted until the safety net.
    assert time.monotonic() - started < SAFETY_NET / 2, "appends waited for the summary"
    assert fake.in_flight == 1 and worker.is_alive()

    fake.release()
    result = worker.outcome()
    assert result.compacted, result.reason
    assert result.reason == Reason.COMPACTED
    assert len(fake.requests) == 1
    history = fake.requests[0]["body"]["messages"][-1]["content"]
    assert "While you summarize" not in history  # appended after the snapshot

    summary = Summary.objects.get(conversation=conversation)
    first_new = len(ORIGINAL)
    assert summary.to_seq < first_new
    new_rows = conversation.messages.filter(seq__gte=first_new).order_by("seq")
    assert [row.as_openai() for row in new_rows] == appended
    assert all(row.summary_id is None for row in new_rows), "an appended message was archived"
    context = context_get(conversation=conversation).messages
    assert context[-len(appended) :] == appended
    assert context[0] == SYSTEM
    assert context[1] == summary_message(summary.text)
    assert_context_invariants(conversation, original_messages=[*ORIGINAL, *appended])
    conversation.refresh_from_db()
    assert conversation.lease_owner == "" and conversation.leased_at is None


def test_concurrent_compactions_write_one_summary(conversation, fake):
    workers_count = 4
    barrier = threading.Barrier(workers_count)
    pk = conversation.pk

    def work():
        barrier.wait(timeout=10)
        return conversation_compact(conversation=Conversation.objects.get(pk=pk))

    workers = [Worker(work) for _ in range(workers_count)]
    for worker in workers:
        worker.start()
    # One worker won the lease and is held in the summarizer; the others are turned away
    # by the lease without calling it.
    assert fake.wait_for_in_flight(1, timeout=10), "no summarizer call started"
    assert wait_until(lambda: sum(worker.is_alive() for worker in workers) == 1), (
        "the workers that lost the lease did not return while the winner was held"
    )
    turned_away = [worker for worker in workers if not worker.is_alive()]
    assert len(turned_away) == workers_count - 1
    assert all(worker.outcome().reason == Reason.IN_PROGRESS for worker in turned_away)
    assert len(fake.requests) == 1

    fake.release()
    results = [worker.outcome() for worker in workers]
    reasons = sorted(str(result.reason) for result in results)
    assert reasons == sorted([Reason.COMPACTED] + [Reason.IN_PROGRESS] * (workers_count - 1))
    assert len(fake.requests) == 1  # a worker turned away by the lease never calls it
    assert Summary.objects.filter(conversation=conversation).count() == 1
    winner = next(result for result in results if result.compacted)
    assert winner.summary.version == 1

    recorded = attempts(conversation)
    assert recorded.count(("compacted", "compacted")) == 1
    assert recorded.count(("skipped", "in_progress")) == workers_count - 1
    assert len(recorded) == workers_count
    assert_context_invariants(conversation, original_messages=ORIGINAL)
    conversation.refresh_from_db()
    assert conversation.lease_owner == "" and conversation.leased_at is None


def test_a_fresh_lease_turns_compaction_away_and_a_stale_one_is_taken_over(conversation, fake):
    fake.mode = "ok"
    leases = Conversation.objects.filter(pk=conversation.pk)

    # Another worker holds a fresh lease: in_progress at once, no LLM call, nothing written.
    leases.update(lease_owner="busy-worker", leased_at=timezone.now() - timedelta(seconds=5))
    started = time.monotonic()
    result = conversation_compact(conversation=conversation)
    assert time.monotonic() - started < 1.0
    assert result.reason == Reason.IN_PROGRESS and not result.compacted
    assert fake.requests == []
    assert Summary.objects.filter(conversation=conversation).count() == 0
    conversation.refresh_from_db()
    assert conversation.lease_owner == "busy-worker", "someone else's fresh lease was touched"
    assert attempts(conversation) == [("skipped", "in_progress")]
    assert_context_invariants(conversation, original_messages=ORIGINAL)

    # The lease is older than LEASE_SECONDS: its worker is gone, the lease is taken over.
    stale = timezone.now() - timedelta(seconds=LEASE_SECONDS + 5)
    leases.update(lease_owner="crashed-worker", leased_at=stale)
    result = conversation_compact(conversation=conversation)
    assert result.compacted, result.reason
    assert len(fake.requests) == 1
    conversation.refresh_from_db()
    assert conversation.lease_owner == "" and conversation.leased_at is None
    assert attempts(conversation) == [("compacted", "compacted"), ("skipped", "in_progress")]
    assert_context_invariants(conversation, original_messages=ORIGINAL)


@pytest.mark.parametrize("first_lease", ["taken_over", "given_back"])
def test_a_snapshot_changed_during_the_call_is_a_conflict(conversation, fake, first_lease):
    """The first worker's lease looks abandoned while its call is in flight; a second worker
    takes it over and commits first. The first must then write nothing.

    ``taken_over``: the first worker finds its lease gone. ``given_back``: its lease is put
    back before it commits, so only the active-summary comparison can catch the change.
    """
    first = compact_held(conversation, fake)
    conversation.refresh_from_db()
    first_token = conversation.lease_owner
    assert first_token, "the first worker holds no lease during its call"
    fake.mode = "ok"  # the next call answers at once; the first one stays held

    meanwhile = user_message("Also add travel insurance, policy TI-77.")
    message_append(conversation=conversation, messages=[meanwhile])
    stale = timezone.now() - timedelta(seconds=LEASE_SECONDS + 60)
    Conversation.objects.filter(pk=conversation.pk).update(leased_at=stale)

    second = conversation_compact(conversation=conversation)
    assert second.compacted, second.reason
    assert fake.in_flight == 1, "the first call ended before the second commit"
    if first_lease == "given_back":
        Conversation.objects.filter(pk=conversation.pk).update(
            lease_owner=first_token, leased_at=timezone.now()
        )

    fake.release()
    result = first.outcome()
    assert not result.compacted
    assert result.reason == Reason.CONFLICT
    assert result.summary is None
    assert len(fake.requests) == 2

    summaries = list(Summary.objects.filter(conversation=conversation))
    assert [summary.pk for summary in summaries] == [second.summary.pk]
    assert summaries[0].version == 1 and summaries[0].active
    assert attempts(conversation) == [("compacted", "compacted"), ("conflict", "conflict")]
    conflict = CompactionAttempt.objects.get(conversation=conversation, outcome="conflict")
    assert conflict.summary_id is None and conflict.messages_archived == 0
    assert_context_invariants(conversation, original_messages=[*ORIGINAL, meanwhile])
    assert context_get(conversation=conversation).messages[-1] == meanwhile
    conversation.refresh_from_db()
    assert conversation.lease_owner == "" and conversation.leased_at is None
