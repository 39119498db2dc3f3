"""The hot paths take a fixed number of queries however long the conversation is: appending
a message (service and REST) and reading the context (selector and REST)."""

from __future__ import annotations

import pytest

from ctxsum.models import Conversation, Message, ToolCall
from ctxsum.selectors import context_get
from ctxsum.services import conversation_create, message_append
from tests import query_budgets as budget
from tests.factories import assistant_calls, assistant_message, tool_result, user_message
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

SIZES = [10, 2000]


def turn(i: int) -> list[dict]:
    """Four messages: a question, a tool call, its result and an answer."""
    call_id = f"call_{i}"
    return [
        user_message(f"Question {i}: what is the weather in city {i}?"),
        assistant_calls(call_id, name="weather", arguments=f'{{"city": {i}}}'),
        tool_result(call_id, f"{i} degrees"),
        assistant_message(f"It is {i} degrees in city {i}."),
    ]


def build(owner, size: int) -> Conversation:
    """A conversation of ``size`` messages: a system prompt, then whole turns, in batches."""
    conversation = conversation_create(owner=owner, system="You are a weather bot.")
    messages = [message for i in range((size - 1) // 4 + 1) for message in turn(i)]
    messages = messages[: size - 1]
    for start in range(0, len(messages), 1000):
        message_append(conversation=conversation, messages=messages[start : start + 1000])
    conversation.refresh_from_db()
    assert conversation.message_count == size
    assert Message.objects.filter(conversation=conversation).count() == size
    assert ToolCall.objects.filter(conversation=conversation).exists()
    return conversation


@pytest.fixture(params=SIZES, ids=[f"{size}-messages" for size in SIZES])
def conversation(request, user) -> Conversation:
    return build(user, request.param)


def test_append_one_message(conversation, assert_queries_at_most) -> None:
    with assert_queries_at_most(budget.APPEND):
        message_append(conversation=conversation, messages=[user_message("One more?")])


def test_append_a_tool_call_and_its_result(conversation, assert_queries_at_most) -> None:
    with assert_queries_at_most(budget.APPEND_TOOL_CALL):
        message_append(conversation=conversation, messages=turn(99_999)[1:2])
    with assert_queries_at_most(budget.APPEND_TOOL_RESULT):
        message_append(conversation=conversation, messages=turn(99_999)[2:3])


def test_append_a_batch(conversation, assert_queries_at_most) -> None:
    # A whole turn (tool call and its result in the same batch): the result finds its
    # request in the batch, so no index lookup.
    with assert_queries_at_most(budget.APPEND_BATCH):
        message_append(conversation=conversation, messages=turn(100_000))


def test_context_selector(conversation, assert_queries_at_most) -> None:
    with assert_queries_at_most(budget.CONTEXT):
        context = context_get(conversation=conversation)
        assert len(context.messages) == conversation.active_message_count


def test_rest_append(api, conversation, assert_queries_at_most) -> None:
    url = api_url("message-list", conversation)
    with assert_queries_at_most(budget.REST_APPEND):
        response = api.post(url, user_message("One more?"), format="json")
    assert response.status_code == 201
    assert response.json()["messages"][0]["seq"] == conversation.message_count


def test_rest_context(api, conversation, assert_queries_at_most) -> None:
    url = api_url("context", conversation)
    with assert_queries_at_most(budget.REST_CONTEXT):
        response = api.get(url)
    assert response.status_code == 200
    assert len(response.json()["messages"]) == conversation.message_count


def test_rest_transcript_page(api, conversation, assert_queries_at_most) -> None:
    url = api_url("message-list", conversation)
    with assert_queries_at_most(budget.TRANSCRIPT_PAGE):
        response = api.get(url)
    assert response.status_code == 200
    assert response.json()["count"] == conversation.message_count


def test_rest_detail(api, conversation, assert_queries_at_most) -> None:
    url = api_url("conversation-detail", conversation)
    with assert_queries_at_most(budget.REST_DETAIL):
        response = api.get(url)
    assert response.status_code == 200
    assert response.json()["stats"]["message_count"] == conversation.message_count


def test_rest_append_with_an_idempotency_key(api, conversation, assert_queries_at_most):
    url = api_url("message-list", conversation)
    with assert_queries_at_most(budget.KEYED_APPEND):
        response = api.post(url, user_message("One more?"), format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 201
    with assert_queries_at_most(budget.KEYED_REPLAY):
        replay = api.post(url, user_message("One more?"), format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert replay.content == response.content
