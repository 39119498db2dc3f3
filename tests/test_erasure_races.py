"""Erasure racing a compaction or a rebuild, with threads on PostgreSQL row locks.

Each worker is a thread with its own connection; the summarizer is the real OpenAI backend
talking to a local server in "hold" mode whose answer repeats the card number, as a model
may; a worker waiting on a lock is detected with ``pg_blocking_pids``. No sleep decides an
outcome (docs/architecture.md, invariant f):

- a redaction that commits while a compaction's call is in flight makes the compaction a
  conflict, whether the message is being archived or the old summary covers it;
- the same for a rebuild;
- a redaction that waits for a compaction's commit withholds the summary that commit wrote.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ctxsum.models import Conversation, Summary
from ctxsum.policy import Reason
from ctxsum.services import (
    compaction,
    conversation_create,
    conversation_rebuild,
    message_append,
    message_redact,
)
from ctxsum.services.redaction import WITHHELD
from tests.factories import booking_history, compact, turns
from tests.postgres import POSTGRES, blocked, compact_held, held_openai, start, wait_until
from tests.test_erasure import CARD_SEQ, DIGITS, assert_erased

pytestmark = POSTGRES


@pytest.fixture
def fake(settings, monkeypatch):
    for server in held_openai(settings, monkeypatch, lease_seconds=30):
        server.reply = f"Ana booked AI-101 and paid with {DIGITS}."
        yield server


def booked(user: Any, **fields: Any) -> Conversation:
    return conversation_create(
        owner=user,
        system="You book flights.",
        messages=[*booking_history(), *turns(2, "more {i}")],
        keep={"messages": 2},
        **fields,
    )


def redact_in_thread(conversation: Conversation) -> Any:
    pk = conversation.pk
    return start(lambda: message_redact(conversation=Conversation.objects.get(pk=pk), seq=CARD_SEQ))


def test_a_redaction_committed_during_the_call_makes_the_compaction_a_conflict(user, fake):
    conversation = booked(user)
    worker = compact_held(conversation, fake, force=True)

    redact_in_thread(conversation).outcome()
    fake.release()

    assert worker.outcome().reason == Reason.CONFLICT
    assert not Summary.objects.filter(conversation=conversation).exists()
    assert_erased(conversation)


def test_a_redaction_of_what_the_old_summary_covers_during_the_call(user, fake):
    conversation = booked(user)
    fake.release()
    compact(conversation)  # offline: v1 holds the card
    fake.hold()
    message_append(conversation=conversation, messages=turns(4, "later {i}"))
    worker = compact_held(conversation, fake, force=True)

    redact_in_thread(conversation).outcome()
    fake.release()

    assert worker.outcome().reason == Reason.CONFLICT
    active = Summary.objects.get(conversation=conversation, active=True)
    assert (active.version, active.text) == (1, WITHHELD)
    assert_erased(conversation)


def test_a_redaction_committed_during_a_rebuild_makes_it_a_conflict(user, fake, settings):
    conversation = booked(user)
    fake.release()
    compact(conversation)
    fake.hold()
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    pk = conversation.pk
    worker = start(lambda: conversation_rebuild(conversation=Conversation.objects.get(pk=pk)))
    assert fake.wait_for_in_flight(1, timeout=10)

    redact_in_thread(conversation).outcome()
    fake.release()

    result = worker.outcome()
    assert (result.rebuilt, result.reason) == (False, Reason.CONFLICT)
    assert Conversation.objects.get(pk=pk).lease_owner == ""
    assert_erased(conversation)


def test_a_redaction_waiting_for_a_compactions_commit_withholds_what_it_wrote(
    user, fake, monkeypatch
):
    conversation = booked(user)
    fake.release()
    inside, go_on = threading.Event(), threading.Event()
    archive = compaction._archive

    def held_archive(*args: Any) -> None:
        inside.set()  # inside the commit's transaction, the row locked
        assert go_on.wait(15)
        archive(*args)

    monkeypatch.setattr(compaction, "_archive", held_archive)
    pk = conversation.pk
    worker = start(
        lambda: compaction.conversation_compact(
            conversation=Conversation.objects.get(pk=pk), force=True
        )
    )
    assert inside.wait(10), "the compaction never reached its commit"
    redactor = redact_in_thread(conversation)
    assert wait_until(lambda: blocked(redactor.pid)), "the redaction did not wait for the lock"

    go_on.set()

    assert worker.outcome().compacted
    redactor.outcome()
    summary = Summary.objects.get(conversation=conversation, active=True)
    assert (summary.text, summary.covers_redacted) == (WITHHELD, True)
    assert_erased(conversation)
