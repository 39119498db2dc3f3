"""A 400 carries ``detail`` and ``code`` like every other error, and each field error its
dotted field and its own code: DRF's codes, ctxsum's message rules' and the tool-call
refusals' (ctxsum.api.errors.invalid_body)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from ctxsum.api.errors import field_errors, invalid_body
from ctxsum.api.exceptions import coded_messages
from ctxsum.services import conversation_create
from tests.support.urls import api_url

CALL = {"id": "call_1", "type": "function", "function": {"name": "find", "arguments": "{}"}}


@pytest.fixture
def conversation(user):
    return conversation_create(owner=user, messages=[{"role": "user", "content": "Hi"}])


def errors_of(response) -> list[tuple[str | None, str]]:
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid" and body["detail"], body
    return [(error["field"], error["code"]) for error in body["errors"]]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"content": "Hi"}, [("role", "required")]),
        ({"role": "robot", "content": "Hi"}, [("role", "invalid_choice")]),
        ({"role": "user", "content": "Hi", "colour": "red"}, [("colour", "unknown_field")]),
        ({"role": "user", "content": "Hi", "tool_call_id": "x"}, [("tool_call_id", "not_allowed")]),
        ({"role": "user", "content": None}, [("content", "null")]),
        ({"role": "user"}, [("content", "required")]),
        ({"role": "user", "content": 5}, [("content", "invalid")]),
        (
            {"role": "tool", "tool_call_id": "nope", "content": "x"},
            [("tool_call_id", "unknown_tool_call")],
        ),
        ([1], [(None, "invalid")]),
    ],
)
def test_an_appended_messages_errors_name_their_field_and_code(
    api, conversation, message, expected
):
    url = api_url("message-list", conversation)
    assert errors_of(api.post(url, message, format="json")) == expected
    assert conversation.messages.count() == 1


@pytest.mark.django_db
def test_a_batchs_errors_name_the_message_by_its_index(api, conversation):
    batch = {"messages": [{"role": "user", "content": "fine"}, {"role": "user"}, "text"]}
    response = api.post(api_url("message-list", conversation), batch, format="json")
    assert errors_of(response) == [("messages.1.content", "required"), ("messages.2", "invalid")]
    assert response.json()["detail"] == "messages.1.content: This field is required. (and 1 more)"
    assert conversation.messages.count() == 1


@pytest.mark.django_db
def test_a_tool_result_answered_twice_or_summarized_has_its_own_code(api, conversation):
    url = api_url("message-list", conversation)
    calls = {"messages": [{"role": "assistant", "content": None, "tool_calls": [CALL]}]}
    assert api.post(url, calls, format="json").status_code == 201
    result = {"role": "tool", "tool_call_id": "call_1", "content": "found"}
    twice = {"messages": [result, result]}
    assert errors_of(api.post(url, twice, format="json")) == [
        ("messages.1.tool_call_id", "tool_call_answered")
    ]
    assert conversation.messages.count() == 2


@pytest.mark.django_db
def test_drf_and_service_errors_keep_their_codes(api, conversation):
    compact = api.post(api_url("compact", conversation), {"force": "maybe"}, format="json")
    assert errors_of(compact) == [("force", "invalid")]
    policy = {"policy": {"trigger": {"messages": -1}}, "title": 5}
    created = api.post(api_url("conversation-list"), policy, format="json")
    assert errors_of(created) == [("title", "invalid")]
    bad_policy = api.post(
        api_url("conversation-list"), {"policy": {"trigger": {"messages": -1}}}, format="json"
    )
    assert errors_of(bad_policy) == [("policy.trigger", "invalid")]
    long_title = api.patch(
        api_url("conversation-detail", conversation), {"subject": "x" * 201}, format="json"
    )
    assert errors_of(long_title) == [("subject", "max_length")]


def test_a_djangos_validation_error_keeps_its_code():
    error = DjangoValidationError(
        {"title": [DjangoValidationError("Too long.", code="max_length")]}
    )
    detail = serializers.ValidationError(coded_messages(error)).detail
    assert list(field_errors(detail)) == [
        {"field": "title", "code": "max_length", "detail": "Too long."}
    ]
    plain = serializers.ValidationError(coded_messages(DjangoValidationError("Bad."))).detail
    assert list(field_errors(plain)) == [{"field": None, "code": "invalid", "detail": "Bad."}]


def test_an_empty_detail_still_says_the_request_is_invalid():
    assert invalid_body({}) == {"detail": "Bad request.", "code": "invalid", "errors": []}
