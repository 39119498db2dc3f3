"""POST /api/conversations/{id}/chat/: the answer, the event stream, every error as JSON with
its code, and hostile bodies refused with a 400 before the model is called."""

from __future__ import annotations

import json
from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator

from ctxsum.chat.models import ChatState, ChatTurn
from ctxsum.models import Conversation, Message
from ctxsum.services import conversation_create
from tests.factories import long_user_message, tool_call, tool_result, user_message
from tests.support.errors import field_codes, field_errors
from tests.support.urls import api_url
from tests.test_schema import answer_schema, assert_valid, validator

pytestmark = pytest.mark.django_db

POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
HISTORY = [long_user_message(f"u{n}") for n in range(4)]


@pytest.fixture
def conversation(user) -> Conversation:
    return conversation_create(owner=user, system="Be brief.", messages=HISTORY[:2], **POLICY)


def chat(api, conversation, **body: Any):
    body.setdefault("message", user_message("Hi!"))
    return api.post(api_url("chat", conversation), body, format="json")


def stored(conversation) -> list[tuple[int, Any]]:
    return list(Message.objects.filter(conversation=conversation).values_list("seq", "content"))


def events(response) -> list[tuple[str | None, str]]:
    """The (event, data) pairs of a text/event-stream answer."""
    assert response["Content-Type"] == "text/event-stream"
    text = b"".join(response.streaming_content).decode()
    assert text.endswith("\n\n")
    parsed = []
    for block in text.strip("\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(fields) <= {"event", "data"}, block
        parsed.append((fields.get("event"), fields["data"]))
    return parsed


def test_a_turn_answers_the_stored_pair_usage_and_stats(api, conversation, chat_model):
    chat_model.reply = "Hello!"
    chat_model.cached_tokens = 2

    response = chat(api, conversation)

    assert response.status_code == 200, response.json()
    data = response.json()
    assert [(m["role"], m["content"], m["seq"]) for m in data["messages"]] == [
        ("user", "Hi!", 3),
        ("assistant", "Hello!", 4),
    ]
    usage = data["usage"]
    assert (usage["model"], usage["attempts"], usage["fallbacks"]) == ("gpt-4o", 1, 0)
    assert usage["cached_tokens"] == 2 and usage["streamed"] is False
    assert data["compaction"] is None
    assert data["stats"]["chat_turns"] == 1 and data["stats"]["message_count"] == 5
    assert data["stats"]["prompt_tokens"] == usage["prompt_tokens"]
    detail = api.get(api_url("conversation-detail", conversation)).json()
    assert detail["stats"] == data["stats"]
    document = SchemaGenerator().get_schema(request=None, public=True)
    assert_valid(answer_schema(document, "/api/conversations/{id}/chat/", "post", 200), data)


def test_a_streamed_turn_is_server_sent_events(api, conversation, chat_model):
    chat_model.reply = "Sunny and 24 C."

    response = chat(api, conversation, stream=True)

    assert response.status_code == 200
    parsed = events(response)
    assert parsed[-1] == (None, "[DONE]")
    event, final = parsed[-2]
    assert event == "ctxsum"
    chunks = [json.loads(data) for event, data in parsed[:-2]]
    assert all(event is None for event, _ in parsed[:-2])
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    result = json.loads(final)
    assert result["messages"][-1]["content"] == text == "Sunny and 24 C."
    assert result["usage"]["streamed"] is True
    assert result["usage"]["completion_tokens"] == chunks[-1]["usage"]["completion_tokens"]
    assert stored(conversation)[-1] == (4, "Sunny and 24 C.")
    # Each event, as a client parses it, is what the schema says the stream carries.
    document = SchemaGenerator().get_schema(request=None, public=True)
    content = document["paths"]["/api/conversations/{id}/chat/"]["post"]["responses"]["200"]
    event_schema = validator(document, content["content"]["text/event-stream"]["schema"])
    for name, data in parsed:
        assert_valid(event_schema, {"event": name or "message", "data": data})
    assert not event_schema.is_valid({"event": "message"})  # no data: not an event of it


def test_an_event_source_asking_for_event_streams_gets_one(api, conversation, chat_model):
    url = api_url("chat", conversation)
    body = {"message": user_message("Hi"), "stream": True}
    response = api.post(url, body, format="json", HTTP_ACCEPT="text/event-stream")
    assert events(response)[-1] == (None, "[DONE]")
    # And an error as JSON, whatever it asked for.
    response = api.post(url, {"mesage": 1}, format="json", HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 400 and field_errors(response) == {"mesage": ["Unknown field."]}
    assert field_codes(response) == {"mesage": ["unknown_field"]}


def test_a_summary_failure_in_a_stream_is_a_json_502_and_no_byte_streamed(api, user, chat_model):
    conversation = conversation_create(owner=user, system="Hi.", messages=HISTORY, **POLICY)
    before = stored(conversation)
    chat_model.model_status = {"summary-model-1": 500}

    response = chat(api, conversation, message=long_user_message("u4"), stream=True)

    assert response.status_code == 502
    assert not response.streaming
    assert response.json()["code"] == "summarizer_error"
    assert [body["model"] for body in chat_model.bodies] == ["summary-model-1"]
    assert stored(conversation) == before
    assert ChatState.objects.get(pk=conversation.pk).chat_calls == 0


def test_a_stream_cut_off_midway_ends_with_an_error_event(api, conversation, chat_model):
    chat_model.drop_after = 3
    before = stored(conversation)

    response = chat(api, conversation, stream=True)

    assert response.status_code == 200
    parsed = events(response)
    event, data = parsed[-1]
    assert event == "error"
    assert json.loads(data)["code"] == "model_error"
    assert len(parsed) >= 2 and all(event is None for event, _ in parsed[:-1])
    assert stored(conversation) == before
    row = ChatState.objects.get(pk=conversation.pk)
    assert (row.chat_calls, row.turn_owner) == (0, "")
    assert not ChatTurn.objects.exists()


def test_a_model_that_fails_to_answer_is_a_502(api, conversation, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_RETRIES": 1}
    chat_model.model_status = {"gpt-4o": 503}
    for stream in (False, True):
        response = chat(api, conversation, stream=stream)
        assert response.status_code == 502
        assert response.json()["code"] == "model_error"
        assert "reason" not in response.json()
    assert len(chat_model.requests) == 4
    assert Message.objects.filter(conversation=conversation).count() == 3


def test_chat_options_that_the_checks_would_refuse_fail_the_call_as_a_502(
    api, conversation, chat_model, settings
):
    # The system checks report a bad CHAT_OPTIONS (E014), but a server may run without them:
    # the call fails as a model error, stores nothing and sends nothing.
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_OPTIONS": {"extra_body": 5}}
    for stream in (False, True):
        response = chat(api, conversation, stream=stream)
        assert response.status_code == 502
        assert response.json()["code"] == "model_error"
    assert chat_model.requests == []
    assert Message.objects.filter(conversation=conversation).count() == 3


def test_limits_and_the_turn_lock_have_their_codes(api, conversation, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_MAX_CALLS_PER_CONVERSATION": 1}
    assert chat(api, conversation).status_code == 200
    response = chat(api, conversation)
    assert response.status_code == 429
    assert (response.json()["code"], response.json()["scope"]) == (
        "call_limit_reached",
        "conversation",
    )
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_MAX_CALLS_PER_CONVERSATION": None}
    ChatState.objects.filter(pk=conversation.pk).update(
        turn_owner="x", turn_started_at="2999-01-01T00:00Z"
    )
    response = chat(api, conversation)
    assert response.status_code == 409 and response.json()["code"] == "turn_in_progress"
    assert len(chat_model.requests) == 1


def test_context_too_long_is_a_400_with_its_code(api, user, chat_model):
    conversation = conversation_create(owner=user, max_context_tokens=100, **POLICY)
    response = chat(api, conversation, message=user_message("word " * 200))
    assert response.status_code == 400
    assert response.json()["code"] == "context_too_long"
    assert chat_model.requests == []


def test_a_tool_round_over_rest(api, conversation, chat_model):
    calls = [tool_call("call_1", "weather", '{"city": "Oslo"}')]
    chat_model.script = [{"tool_calls": calls}]
    tools = [{"type": "function", "function": {"name": "weather"}}]
    first = chat(api, conversation, tools=tools).json()
    assert first["messages"][-1]["tool_calls"] == calls
    result = api.post(
        api_url("message-list", conversation), tool_result("call_1", "9 C"), format="json"
    )
    assert result.status_code == 201

    response = chat(api, conversation, message=None, tools=tools)

    assert response.status_code == 200, response.json()
    assert [m["role"] for m in response.json()["messages"]] == ["assistant"]
    context = api.get(api_url("context", conversation)).json()["messages"]
    assert [m["role"] for m in context[-4:]] == ["user", "assistant", "tool", "assistant"]


def test_someone_elses_conversation_is_404(other_api, conversation, chat_model):
    response = chat(other_api, conversation)
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert chat_model.requests == []


BAD_BODIES = [
    ('{"message": {"role": "user", "content": "hi"}, "strem": true}', "strem"),
    ('{"stream": false}', "message"),
    ('{"message": {"role": "system", "content": "hi"}}', "role"),
    ('{"message": {"role": "user", "content": "a\\u0000b"}}', "content"),
    ('{"message": {"role": "user", "content": "a\\ud800b"}}', "content"),
    ('{"message": null, "temperature": 1e400}', "temperature"),
    ('{"message": null, "temperature": "1"}', "temperature"),
    ('{"message": null, "max_completion_tokens": 1.5}', "max_completion_tokens"),
    ('{"message": null, "max_completion_tokens": 99999999999}', "max_completion_tokens"),
    ('{"message": null, "model": 5}', "model"),
    ('{"message": null, "tools": {"a": 1}}', "tools"),
    (
        '{"message": null, "tools": [{"type": "function", "function": {"name": "f", '
        '"parameters": {"x": "\\ud800"}}}]}',
        "tools",
    ),
    (
        '{"message": null, "tools": [{"type": "function", "function": {"name": "f", '
        '"parameters": {"x": 1e400}}}]}',
        "tools",
    ),
    ('{"message": null, "tool_choice": {"type": "function"}}', "tool_choice"),
    ('{"message": [1, 2]}', "message"),
    ('{"message": "hi"}', "message"),
    ("[]", ""),  # the request as a whole
]


@pytest.mark.parametrize(("body", "field"), BAD_BODIES)
def test_hostile_bodies_are_refused_naming_the_field(api, conversation, chat_model, body, field):
    before = stored(conversation)
    response = api.generic(
        "POST", api_url("chat", conversation), body, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/json"
    assert any(field in key.split(".") for key in field_errors(response)), response.json()
    assert chat_model.requests == []
    assert stored(conversation) == before
    assert ChatState.objects.get(pk=conversation.pk).chat_calls == 0


def test_the_admin_shows_turns_read_only(admin_client, api, conversation, chat_model):
    from django.urls import reverse

    assert chat(api, conversation).status_code == 200
    turn = ChatTurn.objects.get()
    listing = admin_client.get(reverse("admin:ctxsum_chat_chatturn_changelist"))
    assert listing.status_code == 200 and b"gpt-4o" in listing.content
    page = admin_client.get(reverse("admin:ctxsum_chat_chatturn_change", args=[turn.pk]))
    assert page.status_code == 200
    assert admin_client.get(reverse("admin:ctxsum_chat_chatturn_add")).status_code == 403


# --------------------------------------------------------------------------- Idempotency-Key


def keyed_chat(api, conversation, key: str, **body: Any):
    body.setdefault("message", user_message("Hi!"))
    url = api_url("chat", conversation)
    return api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_retried_with_its_key_stores_nothing_and_calls_no_model(
    api, conversation, chat_model, stream
):
    chat_model.reply = "Hello!"
    first = keyed_chat(api, conversation, "turn-1", stream=stream)
    answer = dict(events(first))["ctxsum"] if stream else first.content.decode()
    calls, rows = len(chat_model.requests), stored(conversation)

    retry = keyed_chat(api, conversation, "turn-1", stream=stream)

    assert retry.status_code == 200 and retry["Idempotent-Replayed"] == "true"
    assert retry.json() == json.loads(answer)  # the first answer, as JSON
    assert len(chat_model.requests) == calls and stored(conversation) == rows
    assert ChatTurn.objects.filter(conversation=conversation).count() == 1
    other = keyed_chat(api, conversation, "turn-1", message=user_message("Bye!"), stream=stream)
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"
    assert stored(conversation) == rows


def test_a_stream_that_failed_gives_its_key_back(api, conversation, chat_model):
    chat_model.reply = "A long answer in several pieces."
    chat_model.script = [{"drop_after": 2}]
    failed = keyed_chat(api, conversation, "turn-2", stream=True)
    assert [name for name, _ in events(failed)][-1] == "error"
    rows = stored(conversation)

    retry = keyed_chat(api, conversation, "turn-2", stream=True)

    assert "Idempotent-Replayed" not in retry
    assert dict(events(retry))["ctxsum"]  # it ran, and stored the turn this time
    assert len(stored(conversation)) == len(rows) + 2
