"""Every validation rule over REST: 400 naming the field, and nothing of the request stored.

Single appends, batches (all or none), conversation create and PATCH, size limits (413 with
a JSON body), policies, metadata and the system prompt.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings
from jsonschema import Draft202012Validator

from ctxsum.message_schema import MESSAGE
from ctxsum.models import Conversation, Message, ToolCall
from ctxsum.services import conversation_create
from ctxsum.validation import MAX_ID_LENGTH, MAX_NAME_LENGTH, TOOL_CALL_ID_TYPE
from tests.factories import assistant_calls, tool_call, tool_result, user_message
from tests.support.errors import field_codes, field_errors
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db


LIST_URL = api_url("conversation-list")


@pytest.fixture
def conversation(user) -> Conversation:
    """A conversation whose assistant already requested call_1 (answered) and call_2."""
    return conversation_create(
        owner=user,
        system="You are helpful.",
        messages=[
            user_message("weather?"),
            assistant_calls("call_1", "call_2"),
            tool_result("call_1"),
        ],
    )


def snapshot(conversation: Conversation) -> dict[str, Any]:
    row = Conversation.objects.get(pk=conversation.pk)
    return {
        "counters": (
            row.next_seq,
            row.message_count,
            row.active_message_count,
            row.active_tokens,
            row.revision,
            row.title,
            row.metadata,
            row.model,
            row.trigger,
            row.keep,
        ),
        "messages": list(
            Message.objects.filter(conversation=row)
            .order_by("seq")
            .values_list("seq", "role", "content", "replaced_at")
        ),
        "tool_calls": ToolCall.objects.filter(conversation=row).count(),
    }


def assert_400_naming(response, field: str) -> dict[str, list[str]]:
    """The field errors of a 400 that names ``field`` or a field within it (``policy`` for
    ``policy.trigger``, ``messages`` for ``messages.1.role``), by their dotted field."""
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/json")
    errors = field_errors(response)
    named = [key for key in errors if key == field or key.startswith(f"{field}.")]
    assert named and all(all(errors[key]) for key in named), errors
    return errors


def message_errors(errors: dict[str, list[str]], index: int) -> dict[str, list[str]]:
    """The field errors of message ``index`` of a batch, by its own field ("" for the
    message as a whole)."""
    prefix = f"messages.{index}"
    return {
        key[len(prefix) + 1 :]: words
        for key, words in errors.items()
        if key == prefix or key.startswith(f"{prefix}.")
    }


# Each bad message and the field its error must name.
BAD_MESSAGES: list[tuple[str, dict, str]] = [
    ("role missing", {"content": "hi"}, "role"),
    ("role unknown", {"role": "robot", "content": "hi"}, "role"),
    ("role not a string", {"role": ["user"], "content": "hi"}, "role"),
    ("content missing on user", {"role": "user"}, "content"),
    ("content null on user", user_message(None), "content"),
    (
        "content null on assistant without tool_calls",
        {"role": "assistant", "content": None},
        "content",
    ),
    ("content missing on assistant without tool_calls", {"role": "assistant"}, "content"),
    ("content a number", user_message(42), "content"),
    ("content a dict", user_message({"text": "hi"}), "content"),
    ("content a bool", user_message(True), "content"),
    ("content an empty list", user_message([]), "content"),
    ("part not an object", user_message(["hi"]), "content"),
    ("part of unknown type", user_message([{"type": "video", "video": {"url": "x"}}]), "content"),
    ("text part without text", user_message([{"type": "text"}]), "content"),
    ("text part with a non-string text", user_message([{"type": "text", "text": 5}]), "content"),
    ("image_url without url", user_message([{"type": "image_url", "image_url": {}}]), "content"),
    ("image_url not an object", user_message([{"type": "image_url", "image_url": "x"}]), "content"),
    (
        "image_url with a bad detail",
        user_message([{"type": "image_url", "image_url": {"url": "https://x", "detail": "max"}}]),
        "content",
    ),
    (
        "image part on a system message",
        {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]},
        "content",
    ),
    (
        "image part on an assistant message",
        {
            "role": "assistant",
            "content": [{"type": "image_url", "image_url": {"url": "https://x"}}],
        },
        "content",
    ),
    (
        "image part on a tool message",
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": [{"type": "image_url", "image_url": {"url": "https://x"}}],
        },
        "content",
    ),
    (
        "input_audio in a bad format",
        user_message([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}}]),
        "content",
    ),
    (
        "input_audio without data",
        user_message([{"type": "input_audio", "input_audio": {"format": "wav"}}]),
        "content",
    ),
    (
        "file without data or id",
        user_message([{"type": "file", "file": {"filename": "a.pdf"}}]),
        "content",
    ),
    ("file part not an object", user_message([{"type": "file", "file": "a.pdf"}]), "content"),
    (
        "tool_calls on a user message",
        {**user_message(), "tool_calls": [tool_call("c9")]},
        "tool_calls",
    ),
    (
        "tool_calls on a tool message",
        {**tool_result("call_1"), "tool_calls": [tool_call("c9")]},
        "tool_calls",
    ),
    (
        "tool_calls an empty list",
        {"role": "assistant", "content": "x", "tool_calls": []},
        "tool_calls",
    ),
    (
        "tool_calls not a list",
        {"role": "assistant", "content": "x", "tool_calls": tool_call("c9")},
        "tool_calls",
    ),
    (
        "tool call not an object",
        {"role": "assistant", "content": "x", "tool_calls": ["c9"]},
        "tool_calls",
    ),
    (
        "tool call without id",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        "tool_calls",
    ),
    (
        "tool call with an empty id",
        {"role": "assistant", "content": None, "tool_calls": [tool_call("")]},
        "tool_calls",
    ),
    (
        "tool call ids repeated within a message",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("c9"), tool_call("c9", "other")],
        },
        "tool_calls",
    ),
    (
        "tool call id too long",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("c" * (MAX_ID_LENGTH + 1))],
        },
        "tool_calls",
    ),
    (
        "tool call type not function",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**tool_call("c9"), "type": "custom"}],
        },
        "tool_calls",
    ),
    (
        "tool call without function name",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c9", "type": "function", "function": {"arguments": "{}"}}],
        },
        "tool_calls",
    ),
    (
        "tool call arguments an object",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c9", "type": "function", "function": {"name": "f", "arguments": {}}}
            ],
        },
        "tool_calls",
    ),
    (
        "tool call with an unknown key",
        {"role": "assistant", "content": None, "tool_calls": [{**tool_call("c9"), "index": 0}]},
        "tool_calls",
    ),
    (
        "tool call function with an unknown key",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c9",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{}", "strict": True},
                }
            ],
        },
        "tool_calls",
    ),
    ("tool message without tool_call_id", {"role": "tool", "content": "42"}, "tool_call_id"),
    ("tool message with an empty tool_call_id", tool_result(""), "tool_call_id"),
    ("tool message with a numeric tool_call_id", tool_result(7), "tool_call_id"),  # type: ignore[arg-type]
    (
        "tool_call_id on a user message",
        {**user_message(), "tool_call_id": "call_1"},
        "tool_call_id",
    ),
    (
        "tool_call_id on an assistant message",
        {"role": "assistant", "content": "x", "tool_call_id": "call_1"},
        "tool_call_id",
    ),
    ("tool_call_id nobody requested", tool_result("call_nope"), "tool_call_id"),
    ("unknown top-level field", {**user_message(), "temperature": 0.2}, "temperature"),
    ("deprecated function_call field", {**user_message(), "function_call": {}}, "function_call"),
    ("name empty", {**user_message(), "name": ""}, "name"),
    ("name not a string", {**user_message(), "name": 5}, "name"),
    ("name null", {**user_message(), "name": None}, "name"),
    ("name too long", {**user_message(), "name": "n" * 101}, "name"),
    ("refusal on a user message", {**user_message(), "refusal": "no"}, "refusal"),
    ("refusal not a string", {"role": "assistant", "content": None, "refusal": 5}, "refusal"),
    (
        "annotations not a list",
        {"role": "assistant", "content": "x", "annotations": "a"},
        "annotations",
    ),
    ("audio not an object", {"role": "assistant", "content": None, "audio": "abc"}, "audio"),
    (
        "reasoning_content not a string",
        {"role": "assistant", "content": "x", "reasoning_content": ["r"]},
        "reasoning_content",
    ),
    (
        "reasoning_content on a tool message",
        {**tool_result(), "reasoning_content": "r"},
        "reasoning_content",
    ),
]
BAD_IDS = [case[0] for case in BAD_MESSAGES]

# The code of the error of each bad message that has one of its own.
CODES = {
    "role missing": "required",
    "role unknown": "invalid_choice",
    "role not a string": "invalid_choice",
    "content missing on user": "required",
    "content null on user": "null",
    "content null on assistant without tool_calls": "null",
    "content missing on assistant without tool_calls": "required",
    "tool_calls on a user message": "not_allowed",
    "tool_calls on a tool message": "not_allowed",
    "tool message without tool_call_id": "required",
    "tool_call_id on a user message": "not_allowed",
    "tool_call_id on an assistant message": "not_allowed",
    "tool_call_id nobody requested": "unknown_tool_call",
    "unknown top-level field": "unknown_field",
    "deprecated function_call field": "unknown_field",
    "name null": "null",
    "refusal on a user message": "not_allowed",
    "reasoning_content on a tool message": "not_allowed",
}


# What only the service can tell: an id repeated within a message (no keyword states it),
# and a result that answers no call of the conversation.
BEYOND_THE_SCHEMA = {"tool call ids repeated within a message", "tool_call_id nobody requested"}


@pytest.mark.parametrize(("case", "message", "field"), BAD_MESSAGES, ids=BAD_IDS)
def test_the_message_schema_refuses_what_validation_refuses(case, message, field) -> None:
    """ctxsum.message_schema.MESSAGE, which validation walks, is JSON Schema (draft 2020-12)
    that a validator of the standard reads alike."""
    Draft202012Validator.check_schema(MESSAGE)
    assert Draft202012Validator(MESSAGE).is_valid(message) == (case in BEYOND_THE_SCHEMA)


def test_the_message_schema_takes_what_validation_takes() -> None:
    validator = Draft202012Validator(MESSAGE)
    for message in (
        user_message("hi"),
        assistant_calls("call_1", "call_2"),
        tool_result("call_1"),
        {"role": "assistant", "content": None, "refusal": "no", "annotations": []},
        {"role": "developer", "content": [{"type": "text", "text": "x"}], "tool_calls": None},
    ):
        assert validator.is_valid(message), message


@pytest.mark.parametrize(("case", "message", "field"), BAD_MESSAGES, ids=BAD_IDS)
def test_single_append_rejected(api, conversation, case, message, field) -> None:
    before = snapshot(conversation)
    response = api.post(api_url("message-list", conversation), message, format="json")
    assert_400_naming(response, field)
    if case in CODES:
        assert field_codes(response)[field] == [CODES[case]]
    assert snapshot(conversation) == before


@pytest.mark.parametrize(("case", "message", "field"), BAD_MESSAGES, ids=BAD_IDS)
def test_batch_with_message_3_bad_stores_none(api, conversation, case, message, field) -> None:
    before = snapshot(conversation)
    batch = [
        user_message("one"),
        assistant_calls("call_7"),
        tool_result("call_7"),  # valid: requested earlier in the same batch
        message,
        user_message("five"),
    ]
    response = api.post(api_url("message-list", conversation), {"messages": batch}, format="json")
    errors = assert_400_naming(response, "messages")
    assert field in message_errors(errors, 3), errors
    # Only message 3 has errors: none for the others, none for the batch as a whole.
    assert all(key.startswith("messages.3.") for key in errors), errors
    if case in CODES:
        assert field_codes(response)[f"messages.3.{field}"] == [CODES[case]]
    assert snapshot(conversation) == before


@pytest.mark.parametrize(("case", "message", "field"), BAD_MESSAGES, ids=BAD_IDS)
def test_create_with_a_bad_message_creates_nothing(api, user, case, message, field) -> None:
    response = api.post(
        LIST_URL,
        {"title": "t", "messages": [user_message("first"), message]},
        format="json",
    )
    errors = assert_400_naming(response, "messages")
    assert field in message_errors(errors, 1), errors
    assert all(key.startswith("messages.1.") for key in errors), errors
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()


@pytest.mark.parametrize(("case", "message", "field"), BAD_MESSAGES[:6], ids=BAD_IDS[:6])
def test_create_with_system_reports_the_index_the_client_sent(api, case, message, field) -> None:
    # The service puts `system` in front of the batch; errors must still use the client's
    # own indices.
    response = api.post(
        LIST_URL,
        {
            "system": "Be brief.",
            "messages": [user_message("first"), message, user_message("third")],
        },
        format="json",
    )
    errors = assert_400_naming(response, "messages")
    assert field in message_errors(errors, 1), errors
    assert all(key.startswith("messages.1.") for key in errors), errors
    assert not Conversation.objects.exists()


def test_create_with_system_reports_unknown_tool_result_at_its_index(api) -> None:
    response = api.post(
        LIST_URL,
        {"system": "Be brief.", "messages": [user_message("first"), tool_result("call_x")]},
        format="json",
    )
    errors = assert_400_naming(response, "messages")
    assert message_errors(errors, 0) == {} and "tool_call_id" in message_errors(errors, 1), errors
    assert all(key.startswith("messages.1.") for key in errors), errors
    assert field_codes(response) == {"messages.1.tool_call_id": ["unknown_tool_call"]}
    assert not Conversation.objects.exists()


def test_not_a_message_at_all(api, conversation) -> None:
    before = snapshot(conversation)
    response = api.post(
        api_url("message-list", conversation), ["not", "an", "object"], format="json"
    )
    assert response.status_code == 400
    response = api.post(api_url("message-list", conversation), {"messages": "nope"}, format="json")
    assert_400_naming(response, "messages")
    response = api.post(api_url("message-list", conversation), {"messages": []}, format="json")
    assert_400_naming(response, "messages")
    response = api.post(api_url("message-list", conversation), {"messages": [5]}, format="json")
    assert_400_naming(response, "messages")
    assert snapshot(conversation) == before


# --- accepted edge cases ------------------------------------------------------------------


def test_empty_string_content_is_allowed(api, conversation) -> None:
    response = api.post(api_url("message-list", conversation), user_message(""), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["messages"][0]["content"] == ""
    assert Message.objects.filter(conversation=conversation, content="").count() == 1


def test_null_content_allowed_on_assistant_with_tool_calls(api, conversation) -> None:
    response = api.post(
        api_url("message-list", conversation), assistant_calls("call_9"), format="json"
    )
    assert response.status_code == 201, response.content
    stored = response.json()["messages"][0]
    assert stored["content"] is None
    assert stored["tool_calls"] == [tool_call("call_9")]
    # and missing content is taken as null there
    response = api.post(
        api_url("message-list", conversation),
        {"role": "assistant", "tool_calls": [tool_call("call_10")]},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["messages"][0]["content"] is None


def test_valid_content_parts_are_accepted(api, conversation) -> None:
    parts = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.png", "detail": "low"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-123"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,AA", "filename": "a"}},
    ]
    response = api.post(api_url("message-list", conversation), user_message(parts), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["messages"][0]["content"] == parts


def test_ids_and_names_at_their_length_limits_are_accepted(api, conversation) -> None:
    longest_id = "c" * MAX_ID_LENGTH
    request = {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call(longest_id, name="f" * MAX_ID_LENGTH)],
        "name": "n" * MAX_NAME_LENGTH,
    }
    batch = [request, tool_result(longest_id)]
    url = api_url("message-list", conversation)
    response = api.post(url, {"messages": batch}, format="json")
    assert response.status_code == 201, response.content
    # One character more is a malformed id, not merely one that nobody requested.
    response = api.post(url, tool_result(longest_id + "c"), format="json")
    errors = assert_400_naming(response, "tool_call_id")
    assert errors["tool_call_id"] == [str(TOOL_CALL_ID_TYPE)]


def test_tool_result_answers_an_earlier_stored_request(api, conversation) -> None:
    # call_2 was requested by the fixture's assistant message, never answered yet.
    response = api.post(api_url("message-list", conversation), tool_result("call_2"), format="json")
    assert response.status_code == 201, response.content


def test_tool_call_id_of_another_conversation_is_rejected(api, user, conversation) -> None:
    other = conversation_create(
        owner=user, messages=[user_message("x"), assistant_calls("call_elsewhere")]
    )
    before = snapshot(conversation)
    response = api.post(
        api_url("message-list", conversation), tool_result("call_elsewhere"), format="json"
    )
    assert_400_naming(response, "tool_call_id")
    assert field_codes(response) == {"tool_call_id": ["unknown_tool_call"]}
    assert snapshot(conversation) == before
    # while the conversation that carries it accepts it
    response = api.post(
        api_url("message-list", other), tool_result("call_elsewhere"), format="json"
    )
    assert response.status_code == 201


def test_tool_result_before_its_request_in_a_batch_is_rejected(api, conversation) -> None:
    before = snapshot(conversation)
    batch = [tool_result("call_later"), assistant_calls("call_later")]
    response = api.post(api_url("message-list", conversation), {"messages": batch}, format="json")
    errors = assert_400_naming(response, "messages")
    assert "tool_call_id" in message_errors(errors, 0) and message_errors(errors, 1) == {}
    assert all(key.startswith("messages.0.") for key in errors), errors
    assert field_codes(response) == {"messages.0.tool_call_id": ["unknown_tool_call"]}
    assert snapshot(conversation) == before


def test_ids_repeated_across_messages_are_accepted(api, conversation) -> None:
    from ctxsum.policy import pair_tool_results
    from ctxsum.selectors import context_get

    # call_1 was requested and answered in the fixture; providers reuse ids across turns.
    batch = [user_message("again"), assistant_calls("call_1"), tool_result("call_1", "43")]
    response = api.post(api_url("message-list", conversation), {"messages": batch}, format="json")
    assert response.status_code == 201, response.content
    response = api.post(
        api_url("message-list", conversation),
        {"messages": [assistant_calls("call_1"), tool_result("call_1", "44")]},
        format="json",
    )
    assert response.status_code == 201, response.content
    # each result belongs to the nearest earlier request
    messages = context_get(conversation=conversation).messages
    pairs = pair_tool_results(messages)
    for tool_index, request_index in pairs.items():
        assert request_index is not None
        requests = [i for i in range(tool_index) if messages[i].get("tool_calls")]
        nearest = max(requests)
        assert request_index == nearest
    assert len(pairs) == 3


# --- provider-reply extras ----------------------------------------------------------------

EXTRAS = {
    "refusal": None,
    "annotations": [
        {
            "type": "url_citation",
            "url_citation": {
                "url": "https://x.test",
                "title": "X",
                "start_index": 0,
                "end_index": 4,
            },
        }
    ],
    "audio": {"id": "audio_abc", "expires_at": 1700000000, "transcript": "Hello"},
    "reasoning_content": "The user wants a greeting.",
}


def test_provider_extras_are_accepted_and_returned_unchanged(api, conversation) -> None:
    reply = {"role": "assistant", "content": "Hello", **EXTRAS}
    response = api.post(api_url("message-list", conversation), reply, format="json")
    assert response.status_code == 201, response.content
    stored = response.json()["messages"][0]
    assert {key: stored[key] for key in reply} == reply

    transcript = api.get(api_url("message-list", conversation)).json()["results"]
    assert {key: transcript[-1][key] for key in reply} == reply
    context = api.get(api_url("context", conversation)).json()["messages"]
    assert context[-1] == reply


@pytest.mark.parametrize(
    "extra",
    [{"refusal": "I can't help with that."}, {"audio": {"id": "audio_abc"}}],
    ids=["refusal", "audio"],
)
def test_a_reply_with_null_content_is_accepted(api, conversation, extra) -> None:
    # What the model returned when it refused (the text in `refusal`) or answered in audio.
    reply = {"role": "assistant", "content": None, **extra}
    response = api.post(api_url("message-list", conversation), reply, format="json")
    assert response.status_code == 201, response.content
    assert api.get(api_url("context", conversation)).json()["messages"][-1] == reply


# --- unknown fields of request bodies -----------------------------------------------------


def test_batch_body_with_an_unknown_field(api, conversation) -> None:
    before = snapshot(conversation)
    response = api.post(
        api_url("message-list", conversation),
        {"messages": [user_message()], "stream": True},
        format="json",
    )
    assert_400_naming(response, "stream")
    assert field_codes(response) == {"stream": ["unknown_field"]}
    assert snapshot(conversation) == before


def test_create_body_with_an_unknown_field(api) -> None:
    response = api.post(LIST_URL, {"title": "t", "temperature": 0.3}, format="json")
    assert_400_naming(response, "temperature")
    assert field_codes(response) == {"temperature": ["unknown_field"]}
    assert not Conversation.objects.exists()


def test_patch_body_with_an_unknown_field(api, conversation) -> None:
    before = snapshot(conversation)
    response = api.patch(
        api_url("conversation-detail", conversation), {"title": "new", "owner": 99}, format="json"
    )
    assert_400_naming(response, "owner")
    assert field_codes(response) == {"owner": ["unknown_field"]}
    response = api.patch(
        api_url("conversation-detail", conversation), {"messages": [user_message()]}, format="json"
    )
    assert_400_naming(response, "messages")
    assert field_codes(response) == {"messages": ["unknown_field"]}
    assert snapshot(conversation) == before


# --- sizes: 413 with a JSON body ----------------------------------------------------------


def assert_413_json(response) -> None:
    assert response.status_code == 413, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == "too_large" and body["detail"], body


def test_message_over_max_message_bytes(api, conversation) -> None:
    before = snapshot(conversation)
    with override_settings(CTXSUM={"MAX_MESSAGE_BYTES": 300}):
        response = api.post(
            api_url("message-list", conversation), user_message("x" * 400), format="json"
        )
        assert_413_json(response)
        batch = [user_message("small"), user_message("y" * 400)]
        response = api.post(
            api_url("message-list", conversation), {"messages": batch}, format="json"
        )
        assert_413_json(response)
        # just under the limit is fine
        response = api.post(
            api_url("message-list", conversation), user_message("x" * 200), format="json"
        )
        assert response.status_code == 201
    assert Message.objects.filter(conversation=conversation).count() == len(before["messages"]) + 1


def test_a_message_of_exactly_max_message_bytes_is_accepted(api, conversation) -> None:
    message = user_message("x" * 200)
    size = len(json.dumps(message, ensure_ascii=False).encode())
    url = api_url("message-list", conversation)
    with override_settings(CTXSUM={"MAX_MESSAGE_BYTES": size}):
        response = api.post(url, message, format="json")
        assert response.status_code == 201, response.content
    with override_settings(CTXSUM={"MAX_MESSAGE_BYTES": size - 1}):
        assert_413_json(api.post(url, message, format="json"))


def test_message_over_max_message_bytes_on_create(api) -> None:
    with override_settings(CTXSUM={"MAX_MESSAGE_BYTES": 300}):
        response = api.post(LIST_URL, {"messages": [user_message("x" * 400)]}, format="json")
        assert_413_json(response)
        response = api.post(LIST_URL, {"system": "s" * 400}, format="json")
        assert_413_json(response)
    assert not Conversation.objects.exists()


def test_batch_over_max_batch_messages(api, conversation) -> None:
    before = snapshot(conversation)
    with override_settings(CTXSUM={"MAX_BATCH_MESSAGES": 3}):
        batch = [user_message(str(i)) for i in range(4)]
        response = api.post(
            api_url("message-list", conversation), {"messages": batch}, format="json"
        )
        assert_413_json(response)
        response = api.post(LIST_URL, {"messages": batch}, format="json")
        assert_413_json(response)
        assert Conversation.objects.count() == 1
        response = api.post(
            api_url("message-list", conversation), {"messages": batch[:3]}, format="json"
        )
        assert response.status_code == 201
    assert len(snapshot(conversation)["messages"]) == len(before["messages"]) + 3


def test_body_over_max_body_bytes(api, conversation) -> None:
    before = snapshot(conversation)
    with override_settings(CTXSUM={"MAX_BODY_BYTES": 500}):
        batch = [user_message("z" * 100) for _ in range(6)]
        response = api.post(
            api_url("message-list", conversation), {"messages": batch}, format="json"
        )
        assert_413_json(response)
        response = api.post(LIST_URL, {"messages": batch}, format="json")
        assert_413_json(response)
        response = api.patch(
            api_url("conversation-detail", conversation), {"title": "t" * 600}, format="json"
        )
        assert_413_json(response)
    assert snapshot(conversation) == before
    assert Conversation.objects.count() == 1


def test_form_body_over_djangos_own_upload_limit_is_refused_as_json(
    api, conversation, settings
) -> None:
    # The API takes JSON only: a multipart body is a 415 before Django's limit is reached.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 200
    before = snapshot(conversation)
    response = api.post(
        api_url("message-list", conversation),
        {"role": "user", "content": "f" * 400},
        format="multipart",
    )
    assert response.status_code == 415, response.content
    assert response.json()["code"] == "unsupported_media_type"
    assert snapshot(conversation) == before


# --- policy, metadata, system -------------------------------------------------------------

BAD_POLICIES = [
    ("keep equal to trigger", {"trigger": {"messages": 10}, "keep": {"messages": 10}}),
    ("keep above trigger", {"trigger": {"tokens": 1000}, "keep": {"tokens": 2000}}),
    ("keep above the default trigger", {"keep": {"tokens": 50000}}),
    ("zero", {"keep": {"messages": 0}}),
    ("negative", {"trigger": {"tokens": -5}}),
    ("string", {"keep": {"messages": "5"}}),
    ("float", {"trigger": {"messages": 2.5}}),
    ("bool", {"keep": {"messages": True}}),
    ("both keep keys", {"keep": {"messages": 2, "tokens": 100}}),
    ("empty keep", {"keep": {}}),
    ("empty trigger", {"trigger": {}}),
    ("unknown unit", {"trigger": {"turns": 5}}),
    ("unknown policy key", {"retain": {"messages": 3}}),
    ("trigger not an object", {"trigger": 5}),
    ("policy not an object", "aggressive"),
    ("policy a list", [{"messages": 5}]),
]


@pytest.mark.parametrize(("case", "policy"), BAD_POLICIES, ids=[c[0] for c in BAD_POLICIES])
def test_bad_policy_on_create(api, case, policy) -> None:
    response = api.post(LIST_URL, {"title": "t", "policy": policy}, format="json")
    assert_400_naming(response, "policy")
    if case == "unknown policy key":
        assert field_codes(response) == {"policy.retain": ["unknown_field"]}
    assert not Conversation.objects.exists()


@pytest.mark.parametrize(("case", "policy"), BAD_POLICIES, ids=[c[0] for c in BAD_POLICIES])
def test_bad_policy_on_patch(api, conversation, case, policy) -> None:
    before = snapshot(conversation)
    response = api.patch(
        api_url("conversation-detail", conversation), {"policy": policy}, format="json"
    )
    assert_400_naming(response, "policy")
    assert snapshot(conversation) == before


def test_patch_keep_checked_against_the_stored_trigger(api, user) -> None:
    conversation = conversation_create(owner=user, trigger={"messages": 20})
    before = snapshot(conversation)
    response = api.patch(
        api_url("conversation-detail", conversation),
        {"policy": {"keep": {"messages": 20}}},
        format="json",
    )
    assert_400_naming(response, "policy")
    assert snapshot(conversation) == before
    # Keep plus the system message, the summary and the facts block must stay below the
    # trigger.
    response = api.patch(
        api_url("conversation-detail", conversation),
        {"policy": {"keep": {"messages": 17}}},
        format="json",
    )
    errors = assert_400_naming(response, "policy")
    assert "Keep at most 16 messages" in " ".join(errors["policy.keep"]), errors
    assert snapshot(conversation) == before
    response = api.patch(
        api_url("conversation-detail", conversation),
        {"policy": {"keep": {"messages": 16}}},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["policy"] == {
        "trigger": {"messages": 20},
        "keep": {"messages": 16},
        "max_context_tokens": None,
    }


def test_max_context_tokens_is_checked_and_stored(api, user) -> None:
    conversation = conversation_create(owner=user)
    before = snapshot(conversation)
    for bad in (0, -5, "800", 1.5, True, {"tokens": 800}):
        response = api.patch(
            api_url("conversation-detail", conversation),
            {"policy": {"max_context_tokens": bad}},
            format="json",
        )
        errors = assert_400_naming(response, "policy")
        assert "policy.max_context_tokens" in errors, errors
        assert snapshot(conversation) == before
    response = api.patch(
        api_url("conversation-detail", conversation),
        {"policy": {"max_context_tokens": 800}},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["policy"]["max_context_tokens"] == 800
    assert response.json()["effective_policy"]["max_context_tokens"] == 800


# Each field of a conversation with a value of the wrong type for it.
BAD_FIELDS: list[tuple[str, Any]] = [
    *[("metadata", value) for value in ("tag", 5, ["a"], None)],
    *[("system", value) for value in (123, 1.5, True, ["be nice"], {"content": "x"}, None)],
    ("title", 5),
    ("title", None),
    ("model", 4),
]


@pytest.mark.parametrize(
    ("field", "value"), BAD_FIELDS, ids=[f"{field} {value!r}" for field, value in BAD_FIELDS]
)
def test_a_field_of_the_wrong_type_is_refused_on_create_and_patch(
    api, conversation, field, value
) -> None:
    response = api.post(LIST_URL, {field: value}, format="json")
    assert_400_naming(response, field)
    if value is None:
        assert field_codes(response) == {field: ["null"]}
    assert Conversation.objects.count() == 1
    before = snapshot(conversation)
    response = api.patch(
        api_url("conversation-detail", conversation), {field: value}, format="json"
    )
    assert_400_naming(response, field)
    if value is None:
        assert field_codes(response) == {field: ["null"]}
    assert snapshot(conversation) == before
    assert Conversation.objects.count() == 1


def test_system_and_a_leading_system_message_both_given(api) -> None:
    response = api.post(
        LIST_URL,
        {"system": "A", "messages": [{"role": "system", "content": "B"}]},
        format="json",
    )
    assert_400_naming(response, "system")
    assert not Conversation.objects.exists()


@pytest.mark.parametrize("depth", [5_000, 200_000])
def test_json_nested_too_deeply_is_400_json_not_500(api, conversation, depth) -> None:
    before = snapshot(conversation)
    body = '{"role": "user", "content": ' + "[" * depth + "]" * depth + "}"
    api.raise_request_exception = False
    response = api.generic(
        "POST", api_url("message-list", conversation), body, content_type="application/json"
    )
    assert response.status_code == 400, response.content[:200]
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["detail"]
    assert snapshot(conversation) == before
