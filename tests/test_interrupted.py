"""A worker stopped inside the summarizer call by something that is not an ``Exception``:
KeyboardInterrupt, SystemExit (a worker's shutdown, a timeout), asyncio.CancelledError.

The lease is given back, a failed attempt is recorded with reason ``interrupted``,
``compaction_failed`` is sent, the exception goes on, and the conversation is as it was; a
record that cannot be written (the database unusable) is logged, never raised in the
exception's place. The chat turn's reservation and an Idempotency-Key's claim are given
back on the same exits. On every database the suite runs on (SQLite, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from django.db import OperationalError
from rest_framework.test import APIClient

from ctxsum import signals
from ctxsum.chat import turns as turns_service
from ctxsum.chat.models import ChatCallDay, ChatState
from ctxsum.models import CompactionAttempt, Conversation, IdempotencyKey, Message, Summary
from ctxsum.policy import Reason, failure_reason
from ctxsum.services import conversation_create
from ctxsum.services.compaction import conversation_compact
from ctxsum.services.rebuild import conversation_rebuild
from ctxsum.summarizers.base import Summarizer
from tests.factories import OFFLINE_SUMMARIZER, long_user_message, system_message, user_message
from tests.invariants import assert_context_invariants
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db(transaction=True)

SUMMARIZER = f"{__name__}.InterruptedSummarizer"
POLICY = {"trigger": {"messages": 5}, "keep": {"messages": 1}}
SYSTEM = system_message("You book trips.")
HISTORY = [long_user_message(f"u{index}") for index in range(6)]
COUNTERS = ("next_seq", "message_count", "active_message_count", "active_tokens", "revision")
INTERRUPTIONS = [
    pytest.param(KeyboardInterrupt, id="KeyboardInterrupt"),
    pytest.param(SystemExit, id="SystemExit"),
    pytest.param(asyncio.CancelledError, id="CancelledError"),
]


class InterruptedSummarizer(Summarizer):
    """Raises ``interruption`` inside the call, as a signal handler or a cancellation would
    while the worker waits for the provider."""

    requires_network = False
    interruption: type[BaseException] = KeyboardInterrupt
    calls = 0

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        type(self).calls += 1
        raise type(self).interruption("stopped mid-call")


@pytest.fixture
def interrupted(settings: Any, request: Any) -> type[InterruptedSummarizer]:
    settings.CTXSUM = {"SUMMARIZER": SUMMARIZER, "AUTO_COMPACT": False}
    InterruptedSummarizer.interruption = request.param
    InterruptedSummarizer.calls = 0
    return InterruptedSummarizer


@pytest.fixture
def failures() -> Any:
    received: list[dict[str, Any]] = []

    def receive(**kwargs: Any) -> None:
        received.append(kwargs)

    signals.compaction_failed.connect(receive)
    yield received
    signals.compaction_failed.disconnect(receive)


def state(conversation: Conversation) -> dict[str, Any]:
    """Everything a compaction would change, the lease included."""
    row = Conversation.objects.filter(pk=conversation.pk)
    return {
        "row": row.values(*COUNTERS, "lease_owner", "leased_at", "updated_at").get(),
        "summaries": list(Summary.objects.filter(conversation=conversation).values()),
        "archived": list(
            Message.objects.filter(conversation=conversation).values_list("seq", "summary_id")
        ),
    }


def new_conversation(owner: Any) -> Conversation:
    return conversation_create(owner=owner, system=SYSTEM["content"], messages=HISTORY, **POLICY)


@pytest.mark.parametrize("interrupted", INTERRUPTIONS, indirect=True)
def test_an_interrupted_compaction_gives_the_lease_back_and_records_it(
    user, interrupted, failures, settings
):
    conversation = new_conversation(user)
    before = state(conversation)

    with pytest.raises(interrupted.interruption, match="stopped mid-call"):
        conversation_compact(conversation=conversation)

    assert interrupted.calls == 1
    after = state(conversation)
    assert after["row"]["lease_owner"] == "" and after["row"]["leased_at"] is None
    before["row"].update(lease_owner="", leased_at=None)
    assert after == before, "the interrupted compaction changed the conversation"
    attempt = CompactionAttempt.objects.get(conversation=conversation)
    assert (attempt.outcome, attempt.reason) == ("failed", Reason.INTERRUPTED)
    assert attempt.error == f"{interrupted.interruption.__name__}: stopped mid-call"
    assert (attempt.from_seq, attempt.to_seq) == (1, 5)
    [sent] = failures
    assert sent["attempt"] == attempt
    assert isinstance(sent["error"], interrupted.interruption)
    assert_context_invariants(conversation, original_messages=[SYSTEM, *HISTORY])

    # The lease is free: the next compaction runs at once.
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER, "AUTO_COMPACT": False}
    assert conversation_compact(conversation=conversation).compacted


@pytest.mark.parametrize("interrupted", INTERRUPTIONS, indirect=True)
def test_an_interrupted_rebuild_gives_the_lease_back_and_records_it(user, interrupted, settings):
    conversation = new_conversation(user)
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER, "AUTO_COMPACT": False}
    assert conversation_compact(conversation=conversation).compacted
    settings.CTXSUM = {"SUMMARIZER": SUMMARIZER, "AUTO_COMPACT": False}
    before = state(conversation)

    with pytest.raises(interrupted.interruption):
        conversation_rebuild(conversation=conversation)

    assert state(conversation) == before
    attempt = CompactionAttempt.objects.filter(conversation=conversation).latest("id")
    assert (attempt.outcome, attempt.reason) == ("failed", Reason.INTERRUPTED)


def test_failure_reason_maps_only_what_is_not_an_exception_to_interrupted():
    for interruption in (KeyboardInterrupt(), SystemExit(1), asyncio.CancelledError()):
        assert failure_reason(interruption) == Reason.INTERRUPTED
    assert failure_reason(RuntimeError("bug")) == Reason.ERROR


@pytest.mark.parametrize("interrupted", [KeyboardInterrupt], indirect=True)
def test_an_unusable_database_is_logged_not_raised_over_the_interruption(
    user, interrupted, monkeypatch, caplog, failures
):
    """Neither the release nor the record can be written: the interruption goes on, and
    the log says what could not be done; the lease frees once abandoned."""
    conversation = new_conversation(user)

    def unusable(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("the server closed the connection unexpectedly")

    monkeypatch.setattr("ctxsum.services.leases.lease_release", unusable)
    monkeypatch.setattr("ctxsum.services.compaction.attempt_record", unusable)

    with (
        caplog.at_level(logging.ERROR, logger="ctxsum.compaction"),
        pytest.raises(KeyboardInterrupt),
    ):
        conversation_compact(conversation=conversation)

    messages = [record.getMessage() for record in caplog.records]
    assert any("Could not release the lease" in message for message in messages), messages
    assert any("Could not record the interruption" in message for message in messages), messages
    assert not CompactionAttempt.objects.exists()
    assert failures == []
    conversation.refresh_from_db()
    assert conversation.lease_owner != "", "the lease was released after all"


# The chat turn's reservation and the Idempotency-Key claim, on the same exits.


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, asyncio.CancelledError])
def test_an_interrupted_chat_turn_gives_its_reservation_back(
    user, settings, monkeypatch, interruption
):
    from ctxsum.chat import services as chat

    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER, "CHAT_MAX_CALLS_PER_USER_PER_DAY": 5}
    conversation = conversation_create(owner=user, system="Be brief.", messages=HISTORY[:2])

    def model_call(*args: Any, **kwargs: Any) -> Any:
        raise interruption("stopped mid-call")

    monkeypatch.setattr(chat, "call_model", model_call)
    with pytest.raises(interruption):
        chat.chat_turn(conversation=conversation, message=user_message("Hi"))

    row = ChatState.objects.get(pk=conversation.pk)
    assert (row.turn_owner, row.turn_started_at, row.chat_calls) == ("", None, 0)
    assert Message.objects.filter(conversation=conversation).count() == 3
    assert list(ChatCallDay.objects.values_list("calls", flat=True)) == [0]


def test_a_turn_release_on_an_unusable_database_is_logged_not_raised(
    user, settings, monkeypatch, caplog
):
    from ctxsum.chat import services as chat

    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}
    conversation = conversation_create(owner=user, system="Be brief.", messages=HISTORY[:2])

    def model_call(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    def unusable(reservation: Any) -> None:
        raise OperationalError("the server closed the connection unexpectedly")

    monkeypatch.setattr(chat, "call_model", model_call)
    monkeypatch.setattr(turns_service, "_release", unusable)
    with (
        caplog.at_level(logging.ERROR, logger="ctxsum.chat"),
        pytest.raises(KeyboardInterrupt),
    ):
        chat.chat_turn(conversation=conversation, message=user_message("Hi"))
    assert "Could not give back the turn reservation" in caplog.text
    assert ChatState.objects.get(pk=conversation.pk).turn_owner != ""


@pytest.mark.parametrize("interrupted", INTERRUPTIONS, indirect=True)
def test_an_interrupted_request_gives_its_idempotency_key_back(user, interrupted):
    conversation = new_conversation(user)
    api = APIClient()
    api.force_authenticate(user)
    url = api_url("compact", conversation)

    with pytest.raises(interrupted.interruption):
        api.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")

    assert not IdempotencyKey.objects.exists()
    attempt = CompactionAttempt.objects.get(conversation=conversation)
    assert attempt.reason == Reason.INTERRUPTED
    assert Conversation.objects.get(pk=conversation.pk).lease_owner == ""


def test_a_key_release_on_an_unusable_database_is_logged_not_raised(user, caplog, monkeypatch):
    from ctxsum.services.idempotency import Claim, key_release

    def unusable(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("the server closed the connection unexpectedly")

    monkeypatch.setattr("django.db.models.query.QuerySet.delete", unusable)
    with caplog.at_level(logging.ERROR, logger="ctxsum.idempotency"):
        key_release(Claim(pk=1, token="t", db="default"))
    assert "Could not give back the Idempotency-Key claim 1" in caplog.text
