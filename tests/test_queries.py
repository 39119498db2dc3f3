"""The hot paths take a fixed number of queries however long the conversation is: appending
a message (service and REST) and reading the context (selector and REST)."""

from __future__ import annotations

import pytest
from django.db import connection

from ctxsum.models import Conversation, Message, ToolCall
from ctxsum.selectors import context_get
from ctxsum.services import conversation_create, message_append
from tests.factories import assistant_calls, assistant_message, tool_result, user_message
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

SIZES = [10, 2000]

# Pinned query counts. Appending inside the test's transaction: SAVEPOINT, the UPDATE of
# the counters that locks the conversation row and returns it, INSERT of the messages,
# RELEASE.
TRANSACTION_APPEND_QUERIES = 4
# On PostgreSQL, messages with no tool result: the UPDATE, the INSERT and the tool calls'
# index rows as one statement, with no transaction of its own.
ONE_STATEMENT = connection.vendor == "postgresql"
APPEND_QUERIES = 1 if ONE_STATEMENT else TRANSACTION_APPEND_QUERIES
# A tool result also looks its request up in the tool-call index; a tool call inserts it.
APPEND_TOOL_RESULT_QUERIES = TRANSACTION_APPEND_QUERIES + 1
APPEND_TOOL_CALL_QUERIES = 1 if ONE_STATEMENT else TRANSACTION_APPEND_QUERIES + 1
# A batch with a tool result is checked under the row lock, its tool calls indexed after.
APPEND_BATCH_QUERIES = TRANSACTION_APPEND_QUERIES + 1
# The active summary, the active messages, the key facts (the facts block).
CONTEXT_QUERIES = 3
# Over REST, the owner-scoped lookup of the conversation comes first.
REST_LOOKUP = 1
# Transcript page: the lookup, the paginator's COUNT, the page.
TRANSCRIPT_QUERIES = 3


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


def test_append_one_message(conversation, django_assert_num_queries) -> None:
    with django_assert_num_queries(APPEND_QUERIES):
        message_append(conversation=conversation, messages=[user_message("One more?")])


def test_append_a_tool_call_and_its_result(conversation, django_assert_num_queries) -> None:
    with django_assert_num_queries(APPEND_TOOL_CALL_QUERIES):
        message_append(conversation=conversation, messages=turn(99_999)[1:2])
    with django_assert_num_queries(APPEND_TOOL_RESULT_QUERIES):
        message_append(conversation=conversation, messages=turn(99_999)[2:3])


def test_append_a_batch(conversation, django_assert_num_queries) -> None:
    # A whole turn (tool call and its result in the same batch): the result finds its
    # request in the batch, so no index lookup.
    with django_assert_num_queries(APPEND_BATCH_QUERIES):
        message_append(conversation=conversation, messages=turn(100_000))


def test_context_selector(conversation, django_assert_num_queries) -> None:
    with django_assert_num_queries(CONTEXT_QUERIES):
        context = context_get(conversation=conversation)
        assert len(context.messages) == conversation.active_message_count


def test_rest_append(api, conversation, django_assert_num_queries) -> None:
    url = api_url("message-list", conversation)
    with django_assert_num_queries(REST_LOOKUP + APPEND_QUERIES):
        response = api.post(url, user_message("One more?"), format="json")
    assert response.status_code == 201
    assert response.json()["messages"][0]["seq"] == conversation.message_count


def test_rest_context(api, conversation, django_assert_num_queries) -> None:
    url = api_url("context", conversation)
    with django_assert_num_queries(REST_LOOKUP + CONTEXT_QUERIES):
        response = api.get(url)
    assert response.status_code == 200
    assert len(response.json()["messages"]) == conversation.message_count


def test_rest_transcript_page(api, conversation, django_assert_num_queries) -> None:
    url = api_url("message-list", conversation)
    with django_assert_num_queries(TRANSCRIPT_QUERIES):
        response = api.get(url)
    assert response.status_code == 200
    assert response.json()["count"] == conversation.message_count


# Detail: the lookup, the context (3), the stats (archived totals, active summary, summary
# count, compaction count, chat usage).
DETAIL_QUERIES = REST_LOOKUP + CONTEXT_QUERIES + 5


def test_rest_detail(api, conversation, django_assert_num_queries) -> None:
    url = api_url("conversation-detail", conversation)
    with django_assert_num_queries(DETAIL_QUERIES):
        response = api.get(url)
    assert response.status_code == 200
    assert response.json()["stats"]["message_count"] == conversation.message_count


# With an Idempotency-Key: the claim's INSERT in a savepoint (SAVEPOINT, INSERT, RELEASE),
# the claim marked applied inside the append's transaction, and the answer stored.
KEYED_APPEND_QUERIES = REST_LOOKUP + TRANSACTION_APPEND_QUERIES + 3 + 1 + 1
# A replay: the lookup, the INSERT the unique constraint refuses (SAVEPOINT, INSERT,
# ROLLBACK TO SAVEPOINT, RELEASE), and the key's row.
REPLAY_QUERIES = REST_LOOKUP + 4 + 1


def test_rest_append_with_an_idempotency_key(api, conversation, django_assert_num_queries):
    url = api_url("message-list", conversation)
    with django_assert_num_queries(KEYED_APPEND_QUERIES):
        response = api.post(url, user_message("One more?"), format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 201
    with django_assert_num_queries(REPLAY_QUERIES):
        replay = api.post(url, user_message("One more?"), format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert replay.content == response.content
