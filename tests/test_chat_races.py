"""Chat turns racing each other and appends, on PostgreSQL: worker threads with their own
connections, the model reached through the real openai client on a local server that holds
every call until the test releases it.

- a second turn of a conversation whose turn is in flight answers TurnInProgress at once,
  without waiting for the model;
- turns and appends racing on one conversation leave every turn's message and reply adjacent;
- two turns racing for a user's last call of the day: exactly one gets it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ctxsum.chat.exceptions import CallLimitReached, TurnInProgress
from ctxsum.chat.models import ChatCallDay, ChatState, ChatTurn
from ctxsum.chat.services import chat_turn
from ctxsum.models import Conversation, Message
from ctxsum.selectors import context_get
from ctxsum.services import conversation_create, message_append
from tests.factories import user_message
from tests.invariants import assert_context_invariants
from tests.postgres import POSTGRES, held_openai, start

pytestmark = POSTGRES


@pytest.fixture
def fake(settings, monkeypatch):
    for server in held_openai(settings, monkeypatch, lease_seconds=30):
        settings.CTXSUM = {
            **settings.CTXSUM,
            "CHAT_OPTIONS": {"base_url": server.base_url, "api_key": "test"},
            "CHAT_RETRY_BACKOFF": 0,
            "CHAT_TIMEOUT": 20,
        }
        yield server


def turn_in_thread(pk: Any, text: str, **kwargs: Any):
    return start(
        lambda: chat_turn(
            conversation=Conversation.objects.get(pk=pk), message=user_message(text), **kwargs
        )
    )


def test_a_second_turn_is_refused_at_once_while_one_is_in_flight(user, fake):
    conversation = conversation_create(owner=user, system="Be brief.")
    first = turn_in_thread(conversation.pk, "first")
    assert fake.wait_for_in_flight(1, timeout=10), "the first turn never called the model"

    started = time.monotonic()
    with pytest.raises(TurnInProgress):
        chat_turn(conversation=conversation, message=user_message("second"))
    assert time.monotonic() - started < 2, "the second turn waited for the first"
    # An append is not refused: it lands before the turn's pair.
    message_append(conversation=conversation, messages=[user_message("meanwhile")])

    fake.release()
    result = first.outcome()
    assert [row.seq for row in result.messages] == [2, 3]
    assert len(fake.requests) == 1
    state = ChatState.objects.get(pk=conversation.pk)
    assert (state.turn_owner, state.chat_calls) == ("", 1)


TURNS = 4
WORKERS = 3
APPENDS = 10


def test_turns_and_appends_racing_leave_every_pair_adjacent(user, fake):
    fake.release()  # every call answers at once
    conversation = conversation_create(
        owner=user, system="Be brief.", trigger={"messages": 10_000}, keep={"messages": 2}
    )
    pk = conversation.pk
    barrier = threading.Barrier(WORKERS + 1)
    refused = []

    def turns(index: int) -> None:
        mine = Conversation.objects.get(pk=pk)
        barrier.wait(timeout=10)
        done = 0
        while done < TURNS:
            try:
                chat_turn(conversation=mine, message=user_message(f"w{index} t{done}"))
                done += 1
            except TurnInProgress:
                refused.append(index)
                time.sleep(0.001)

    def appends() -> None:
        mine = Conversation.objects.get(pk=pk)
        barrier.wait(timeout=10)
        for number in range(APPENDS):
            message_append(conversation=mine, messages=[user_message(f"append {number}")])

    workers = [start(lambda index=index: turns(index)) for index in range(WORKERS)]
    workers.append(start(appends))
    for worker in workers:
        worker.outcome(timeout=60)

    records = ChatTurn.objects.filter(conversation_id=pk).select_related("message", "reply")
    assert records.count() == TURNS * WORKERS
    for record in records:
        assert record.reply.seq == record.message.seq + 1, "a message slipped into a pair"
        assert record.reply.role == "assistant"
    seqs = list(Message.objects.filter(conversation_id=pk).values_list("seq", flat=True))
    assert seqs == list(range(1 + APPENDS + 2 * TURNS * WORKERS))
    row = Conversation.objects.get(pk=pk)
    state = ChatState.objects.get(pk=pk)
    assert (state.chat_calls, state.turn_owner) == (TURNS * WORKERS, "")
    assert refused, "the turns never met (the test proved nothing)"
    assert_context_invariants(row)
    assert len(context_get(conversation=row).messages) == len(seqs)


def test_two_turns_racing_for_the_last_call_of_the_day(user, fake, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_MAX_CALLS_PER_USER_PER_DAY": 1}
    conversations = [conversation_create(owner=user) for _ in range(2)]
    barrier = threading.Barrier(2)

    def race(pk: Any) -> Any:
        mine = Conversation.objects.get(pk=pk)
        barrier.wait(timeout=10)
        try:
            return chat_turn(conversation=mine, message=user_message("mine"), user=user)
        except CallLimitReached as refused:
            return refused

    workers = [start(lambda pk=c.pk: race(pk)) for c in conversations]
    assert fake.wait_for_in_flight(1, timeout=10)
    fake.release()
    outcomes = [worker.outcome() for worker in workers]

    refusals = [o for o in outcomes if isinstance(o, CallLimitReached)]
    assert len(refusals) == 1 and refusals[0].scope == "user_day"
    assert len(fake.requests) == 1
    assert ChatCallDay.objects.get(user=user).calls == 1
    assert ChatTurn.objects.count() == 1
    assert sorted(ChatState.objects.values_list("chat_calls", flat=True)) == [0, 1]
