"""Requests a hostile client sends: every one answers a JSON 4xx naming what is wrong, and
nothing of it is stored. Bodies are raw JSON text, so lone surrogates (``\\ud800``) and
numbers past float range (``1e400``, parsed as infinity) reach the server as sent. Run on
PostgreSQL too, where a NUL character or an infinity that slipped through would be a
DataError (a 500)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from ctxsum.models import Conversation, Message
from ctxsum.services import conversation_create
from tests.support.errors import field_codes, field_errors

pytestmark = pytest.mark.django_db

NUL = "a\\u0000b"  # as JSON text
SURROGATE = "a\\ud800b"
INFINITY = "1e400"

BAD_STRINGS = {"nul": NUL, "surrogate": SURROGATE}


def raw(template: Any, value: str) -> str:
    """``template`` as JSON, with the string "@" replaced by the raw JSON text ``value``."""
    return json.dumps(template).replace('"@"', value)


def call(call_id: str = "call_1", arguments: str = "{}") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "lookup", "arguments": arguments},
    }


# (case, JSON text of the message with "@" for the bad value, the field the error names)
MESSAGE_FIELDS = [
    ("content", {"role": "user", "content": "@"}, "content"),
    ("name", {"role": "user", "content": "hi", "name": "@"}, "name"),
    ("role", {"role": "@", "content": "hi"}, "role"),
    ("text part", {"role": "user", "content": [{"type": "text", "text": "@"}]}, "content"),
    ("tool_call_id", {"role": "tool", "tool_call_id": "@", "content": "ok"}, "tool_call_id"),
    (
        "tool call arguments",
        {"role": "assistant", "content": None, "tool_calls": [call(arguments="@")]},
        "tool_calls",
    ),
    (
        "tool call id",
        {"role": "assistant", "content": None, "tool_calls": [call("@")]},
        "tool_calls",
    ),
    ("refusal", {"role": "assistant", "content": None, "refusal": "@"}, "refusal"),
    (
        "reasoning",
        {"role": "assistant", "content": "x", "reasoning_content": "@"},
        "reasoning_content",
    ),
    (
        "image url",
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "@"}}]},
        "content",
    ),
]
NUMBER_FIELDS = [
    ("audio", {"role": "assistant", "content": None, "audio": {"id": "@"}}, "audio"),
    ("part key", {"role": "user", "content": [{"type": "text", "text": "x", "n": "@"}]}, "content"),
    ("annotations", {"role": "assistant", "content": "x", "annotations": ["@"]}, "annotations"),
]
SHAPES = [
    ("filename number", {"type": "file", "file": {"file_id": "f1", "filename": 123}}),
    ("filename list", {"type": "file", "file": {"file_id": "f1", "filename": [1]}}),
    ("filename object", {"type": "file", "file": {"file_id": "f1", "filename": {"a": 1}}}),
    ("part unknown key", {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}),
    ("image unknown key", {"type": "image_url", "image_url": {"url": "u", "size": 3}}),
    (
        "audio unknown key",
        {"type": "input_audio", "input_audio": {"data": "d", "format": "wav", "x": 1}},
    ),
    ("image not object", {"type": "image_url", "image_url": "http://x"}),
]


@pytest.fixture
def conversation(user):
    return conversation_create(
        owner=user,
        system="Sys.",
        messages=[
            {"role": "user", "content": "Look it up."},
            {"role": "assistant", "content": None, "tool_calls": [call()]},
        ],
    )


def snapshot(conversation: Conversation) -> tuple[Any, ...]:
    row = Conversation.objects.get(pk=conversation.pk)
    rows = list(Message.objects.filter(conversation=row).values_list("seq", "content"))
    return row.revision, row.message_count, row.metadata, row.title, rows


def post_raw(api, url: str, body: str):
    return api.generic("POST", url, body, content_type="application/json")


def assert_refused(response, field: str, status: int = 400) -> None:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    assert any(field in key.split(".") for key in field_errors(response)), response.json()


def message_errors(answer: Any, index: int) -> dict[str, list[str]]:
    """The field errors of message ``index`` of a batch, by its own field ("" for the
    message as a whole)."""
    prefix = f"messages.{index}"
    return {
        key[len(prefix) + 1 :]: words
        for key, words in field_errors(answer).items()
        if key == prefix or key.startswith(f"{prefix}.")
    }


def messages_url(conversation: Conversation) -> str:
    return reverse("ctxsum:message-list", kwargs={"pk": conversation.pk})


@pytest.mark.parametrize("kind", sorted(BAD_STRINGS))
@pytest.mark.parametrize(("case", "template", "field"), MESSAGE_FIELDS, ids=lambda v: str(v)[:20])
def test_bad_characters_in_a_message_are_refused(api, conversation, kind, case, template, field):
    before = snapshot(conversation)
    response = post_raw(api, messages_url(conversation), raw(template, f'"{BAD_STRINGS[kind]}"'))
    assert_refused(response, field)
    # In a batch, the error names the message's index too.
    batch = raw(
        {"messages": [{"role": "user", "content": "ok"}, template]}, f'"{BAD_STRINGS[kind]}"'
    )
    response = post_raw(api, messages_url(conversation), batch)
    assert_refused(response, field)
    assert message_errors(response, 0) == {}
    assert field in message_errors(response, 1)
    assert snapshot(conversation) == before


@pytest.mark.parametrize(("case", "template", "field"), NUMBER_FIELDS, ids=lambda v: str(v)[:20])
def test_numbers_that_are_not_finite_are_refused(api, conversation, case, template, field):
    before = snapshot(conversation)
    response = post_raw(api, messages_url(conversation), raw(template, INFINITY))
    assert_refused(response, field)
    assert snapshot(conversation) == before


@pytest.mark.parametrize(("case", "part"), SHAPES, ids=[case for case, _ in SHAPES])
def test_content_parts_have_openais_shapes(api, conversation, case, part):
    before = snapshot(conversation)
    response = api.post(
        messages_url(conversation), {"role": "user", "content": [part]}, format="json"
    )
    assert_refused(response, "content")
    assert snapshot(conversation) == before


@pytest.mark.parametrize("body", ["123", "null", "false", '"text"', "{}"])
def test_a_batch_that_is_not_a_list_is_refused(api, conversation, body):
    before = snapshot(conversation)
    response = post_raw(api, messages_url(conversation), f'{{"messages": {body}}}')
    assert_refused(response, "messages")
    assert snapshot(conversation) == before


@pytest.mark.parametrize("value", [NUL, SURROGATE])
@pytest.mark.parametrize("where", ["metadata value", "metadata key", "title", "model", "system"])
def test_bad_characters_in_a_conversations_fields_are_refused(
    api, user, conversation, where, value
):
    bodies = {
        "metadata value": '{"metadata": {"k": "@"}}',
        "metadata key": '{"metadata": {"@": 1}}',
        "title": '{"title": "@"}',
        "model": '{"model": "@"}',
        "system": '{"system": "@"}',
    }
    body = bodies[where].replace("@", value)
    field = where.split()[0]
    count = Conversation.objects.count()
    assert_refused(post_raw(api, reverse("ctxsum:conversation-list"), body), field)
    assert Conversation.objects.count() == count
    before = snapshot(conversation)
    url = reverse("ctxsum:conversation-detail", kwargs={"pk": conversation.pk})
    response = api.generic("PATCH", url, body, content_type="application/json")
    assert_refused(response, field)
    assert snapshot(conversation) == before


def test_infinity_in_metadata_is_refused(api, conversation):
    before = snapshot(conversation)
    url = reverse("ctxsum:conversation-detail", kwargs={"pk": conversation.pk})
    body = f'{{"metadata": {{"n": {INFINITY}}}}}'
    assert_refused(api.generic("PATCH", url, body, content_type="application/json"), "metadata")
    assert snapshot(conversation) == before


def test_a_second_result_for_one_call_is_refused(api, conversation):
    url = messages_url(conversation)
    result = {"role": "tool", "tool_call_id": "call_1", "content": "found"}
    assert api.post(url, result, format="json").status_code == 201
    before = snapshot(conversation)
    response = api.post(url, result, format="json")
    assert_refused(response, "tool_call_id")
    assert field_codes(response) == {"tool_call_id": ["tool_call_answered"]}
    assert snapshot(conversation) == before


def test_two_results_for_one_call_in_one_batch_are_refused(api, conversation):
    before = snapshot(conversation)
    result = {"role": "tool", "tool_call_id": "call_1", "content": "found"}
    response = api.post(messages_url(conversation), {"messages": [result, result]}, format="json")
    assert_refused(response, "tool_call_id")
    assert message_errors(response, 0) == {}
    assert field_codes(response) == {"messages.1.tool_call_id": ["tool_call_answered"]}
    assert snapshot(conversation) == before


def test_a_reused_id_answers_its_newest_request(api, conversation):
    """A provider may reuse an id for a new call: its result answers the new request."""
    url = messages_url(conversation)
    result = {"role": "tool", "tool_call_id": "call_1", "content": "first"}
    again = {"role": "assistant", "content": None, "tool_calls": [call()]}
    response = api.post(url, {"messages": [result, again, result]}, format="json")
    assert response.status_code == 201, response.json()


@pytest.mark.parametrize(
    "spelling",
    ["urn:uuid:{pk}", "{{{pk}}}", "{upper}", "{hex}"],
)
def test_an_id_only_in_its_canonical_form(api, conversation, spelling):
    pk = str(conversation.pk)
    other = spelling.format(pk=pk, upper=pk.upper(), hex=pk.replace("-", ""))
    assert api.get(reverse("ctxsum:conversation-detail", kwargs={"pk": pk})).status_code == 200
    response = api.get(reverse("ctxsum:conversation-detail", kwargs={"pk": other}))
    assert response.status_code == 404
    assert response.json() == {"detail": "No such conversation.", "code": "not_found"}


def test_errors_of_a_create_name_the_index_the_client_sent(api):
    """The system prompt goes first in the conversation, not in the client's list."""
    orphan = {"role": "tool", "tool_call_id": "call_nobody_made", "content": "42"}
    body = {"system": "Sys.", "messages": [{"role": "user", "content": "hi"}, orphan]}
    response = api.post(reverse("ctxsum:conversation-list"), body, format="json")
    assert response.status_code == 400
    assert message_errors(response, 0) == {}
    assert "tool_call_id" in message_errors(response, 1)
    assert field_codes(response)["messages.1.tool_call_id"] == ["unknown_tool_call"]
    assert not Conversation.objects.exists()


def test_patch_policy_null_resets_every_override(api, user):
    from ctxsum.conf import ctxsum_settings

    policy = {"trigger": {"messages": 30}, "keep": {"messages": 5}, "max_context_tokens": 900}
    conversation = conversation_create(owner=user, **policy)
    url = reverse("ctxsum:conversation-detail", kwargs={"pk": conversation.pk})
    response = api.patch(url, {"policy": None}, format="json")
    assert response.status_code == 200, response.json()
    data = response.json()
    assert data["policy"] == {"trigger": None, "keep": None, "max_context_tokens": None}
    assert data["effective_policy"]["trigger"] == ctxsum_settings.TRIGGER
    assert data["revision"] == conversation.revision + 1
