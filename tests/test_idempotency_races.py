"""Idempotency keys against concurrent requests, on PostgreSQL: each request is a thread
with its own connection, through the whole REST stack.

- a retry while the first compaction is still in its summarizer call is turned away at once
  (409 ``idempotency_key_in_progress``), and replayed once the first has answered;
- appends racing with the same key store exactly one message.
"""

from __future__ import annotations

import json
import threading

import pytest
from rest_framework.test import APIClient

from ctxsum.api.idempotency import REPLAYED_HEADER
from ctxsum.models import IdempotencyKey, Message, Summary
from ctxsum.services import conversation_create
from tests.factories import user_message, weather_history
from tests.openai_server import FakeOpenAI
from tests.postgres import POSTGRES, held_openai, start
from tests.support.urls import api_url

pytestmark = POSTGRES

RACERS = 6


@pytest.fixture
def fake(settings, monkeypatch):
    yield from held_openai(settings, monkeypatch, lease_seconds=30)


def client(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def post(user, url: str, body: object, key: str):
    text = json.dumps(body)
    return client(user).generic(
        "POST", url, text, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def test_a_retry_during_the_first_compaction_is_409_then_replayed(user, fake: FakeOpenAI):
    conversation = conversation_create(
        owner=user,
        system="You are a travel assistant.",
        messages=weather_history(),
        trigger={"messages": 6},
        keep={"messages": 2},
    )
    url = api_url("compact", conversation)
    first = start(lambda: post(user, url, {}, "compact-1"))
    assert fake.wait_for_in_flight(1, timeout=10), "the summarizer call never started"

    during = post(user, url, {}, "compact-1")

    assert during.status_code == 409, during.content
    assert during.json()["code"] == "idempotency_key_in_progress"
    fake.release()
    answered = first.outcome()
    assert answered.status_code == 200 and answered.json()["compacted"] is True
    after = post(user, url, {}, "compact-1")
    assert after.status_code == 200 and after[REPLAYED_HEADER] == "true"
    assert after.content == answered.content
    assert len(fake.requests) == 1
    assert Summary.objects.filter(conversation=conversation).count() == 1


def test_appends_racing_with_one_key_store_one_message(user):
    conversation = conversation_create(owner=user)
    url = api_url("message-list", conversation)
    message = user_message("Book the 9:40, please.")
    ready = threading.Barrier(RACERS)

    def racer():
        ready.wait(timeout=10)
        return post(user, url, message, "append-1")

    workers = [start(racer) for _ in range(RACERS)]
    answers = [worker.outcome() for worker in workers]

    assert Message.objects.filter(conversation=conversation).count() == 1
    created = [a for a in answers if a.status_code == 201]
    turned_away = [a for a in answers if a.status_code == 409]
    assert len(created) + len(turned_away) == RACERS, [a.status_code for a in answers]
    assert {a.json()["code"] for a in turned_away} <= {"idempotency_key_in_progress"}
    # Exactly one ran; every other 201 is its answer replayed.
    ran = [a for a in created if REPLAYED_HEADER not in a]
    assert len(ran) == 1
    assert all(a.content == ran[0].content for a in created)
    key = IdempotencyKey.objects.get()
    assert key.state == IdempotencyKey.State.DONE and key.applied_at is not None
    conversation.refresh_from_db()
    assert (conversation.message_count, conversation.next_seq) == (1, 1)
