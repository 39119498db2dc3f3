"""The chat endpoint served through Django's ASGI handler (``AsyncClient``): the turn runs
with ``achat_turn``, a streamed answer reaches the client while the model is still
answering, and every answer is what the endpoint answers under WSGI: the JSON answer,
errors as JSON with their codes, an Idempotency-Key's replay."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from ctxsum.chat.models import ChatState, ChatTurn
from ctxsum.models import Conversation, Message
from ctxsum.services import conversation_create
from tests.factories import long_user_message, user_message
from tests.support.errors import field_codes, field_errors
from tests.support.urls import api_url

# The endpoint runs a turn's database work in its own thread (ctxsum.chat.views.DATABASE):
# what the test writes must be committed for it to see.
pytestmark = pytest.mark.django_db(transaction=True)

POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
HISTORY = [long_user_message(f"u{n}") for n in range(2)]


@pytest.fixture
def conversation(user) -> Conversation:
    return conversation_create(owner=user, system="Be brief.", messages=HISTORY, **POLICY)


@pytest.fixture
def client(user) -> AsyncClient:
    client = AsyncClient()
    client.force_login(user)
    return client


async def post(
    client: AsyncClient, conversation: Conversation, headers: Any = None, **body: Any
) -> Any:
    body.setdefault("message", user_message("Hi!"))
    url = api_url("chat", conversation)
    return await client.post(url, body, content_type="application/json", headers=headers or {})


def parse(text: str) -> list[tuple[str | None, str]]:
    parsed = []
    for block in text.strip("\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        parsed.append((fields.get("event"), fields["data"]))
    return parsed


def stored(conversation: Conversation) -> list[tuple[int, Any]]:
    return list(Message.objects.filter(conversation=conversation).values_list("seq", "content"))


def test_a_streamed_turn_reaches_the_client_while_the_model_answers(
    client, conversation, chat_model
):
    chat_model.reply = "One two three."
    chat_model.pause_after = 2  # the role chunk and the first piece, then held

    async def run() -> tuple[list[bytes], int, list[bytes]]:
        response = await post(client, conversation, stream=True)
        assert response.status_code == 200
        assert response["Content-Type"] == "text/event-stream"
        events = aiter(response.streaming_content)
        first: list[bytes] = []
        while b'"content": "One ' not in b"".join(first):
            first.append(await anext(events))
        # The first piece of the answer is here, and the model has not finished: its
        # request is still open.
        in_flight = chat_model.in_flight
        chat_model.resume()
        return first, in_flight, [chunk async for chunk in events]

    first, in_flight, rest = async_to_sync(run)()

    assert in_flight == 1
    events = parse(b"".join(first + rest).decode())
    assert events[-1] == (None, "[DONE]")
    answer = json.loads(events[-2][1])
    assert events[-2][0] == "ctxsum" and answer["usage"]["streamed"] is True
    assert [m["content"] for m in answer["messages"]] == ["Hi!", "One two three."]
    assert stored(conversation)[-1] == (4, "One two three.")
    assert all(r["headers"]["user-agent"].startswith("AsyncOpenAI/") for r in chat_model.requests)


def test_a_turn_answers_its_json_as_under_wsgi(client, conversation, chat_model):
    chat_model.reply = "Hello!"

    response = async_to_sync(post)(client, conversation)

    assert response.status_code == 200, response.content
    data = json.loads(response.content)
    assert [(m["role"], m["content"], m["seq"]) for m in data["messages"]] == [
        ("user", "Hi!", 3),
        ("assistant", "Hello!", 4),
    ]
    assert data["usage"]["streamed"] is False and data["stats"]["chat_turns"] == 1


def test_a_key_replays_the_stored_turn_without_calling_the_model(client, conversation, chat_model):
    chat_model.reply = "Hello!"
    headers = {"Idempotency-Key": "turn-1"}

    first = async_to_sync(post)(client, conversation, headers=headers)
    again = async_to_sync(post)(client, conversation, headers=headers)

    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert json.loads(again.content) == json.loads(first.content)
    assert len(chat_model.requests) == 1
    assert ChatTurn.objects.filter(conversation=conversation).count() == 1


def test_a_model_failure_before_the_first_chunk_is_a_json_error(
    client, conversation, chat_model, settings
):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_RETRIES": 0}
    chat_model.model_status = {"gpt-4o": 400}
    before = stored(conversation)
    headers = {"Idempotency-Key": "turn-2"}

    response = async_to_sync(post)(client, conversation, headers=headers, stream=True)

    assert response.status_code == 502
    assert response["Content-Type"].startswith("application/json")
    assert json.loads(response.content)["code"] == "model_error"
    assert stored(conversation) == before
    assert ChatState.objects.get(pk=conversation.pk).turn_owner == ""
    # The key was given back: the same key runs the turn once the model answers.
    chat_model.model_status = {}
    retried = async_to_sync(post)(client, conversation, headers=headers)
    assert retried.status_code == 200 and "Idempotent-Replayed" not in retried


def test_a_turn_while_another_runs_is_a_409(client, conversation, chat_model):
    chat_model.mode = "hold"

    async def run() -> Any:
        import asyncio

        first = asyncio.ensure_future(post(client, conversation))
        await asyncio.sleep(0)
        while chat_model.in_flight == 0:
            await asyncio.sleep(0.01)
        second = await post(client, conversation, message=user_message("Me too"))
        chat_model.release()
        return await first, second

    first, second = async_to_sync(run)()

    assert first.status_code == 200
    assert second.status_code == 409
    assert json.loads(second.content)["code"] == "turn_in_progress"


def test_a_bad_body_is_a_400_naming_the_field(client, conversation, chat_model):
    response = async_to_sync(post)(client, conversation, message={"role": "user"})

    assert response.status_code == 400
    body = json.loads(response.content)
    errors = field_errors(body)
    assert any(key == "message" or key.startswith("message.") for key in errors), errors
    assert field_codes(body) == {"message.content": ["required"]}
    assert chat_model.requests == []
