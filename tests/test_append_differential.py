"""The two paths of an append store the same rows (services/messages.py, ``_append``).

On PostgreSQL an append with nothing to check under the row lock is one statement
(``append_claim_insert``); every other append, and every append on SQLite, runs the
transaction (``_in_transaction``). Random conversations (a system prompt or none, leading
system and developer messages, user messages with names and content parts, assistant
messages with parallel tool calls and provider extras, tool results, text from all of
Unicode) are appended batch by batch to two conversations: to one through
``message_append``, which takes the one statement whenever it can (checked: one query), to
the other always through the transaction. Afterwards every stored message, every tool-call
index row and the conversation's counters are compared field by field, ids and timestamps
aside, and what each append handed back is compared with what it stored.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ctxsum.models import Conversation, Message, ToolCall
from ctxsum.policy import LEADING_ROLES
from ctxsum.services.conversations import conversation_create
from ctxsum.services.messages import (
    _in_transaction,
    message_append,
    messages_clean,
    messages_count,
)
from tests.factories import tool_call, tool_result

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="the one statement is PostgreSQL's; set DATABASE_URL",
    ),
    pytest.mark.django_db,
]

# What differs between two conversations by construction.
OWN = {"id", "conversation_id", "message_id", "created_at", "updated_at"}

# Any character a message may hold: every Unicode category but surrogates, no NUL.
texts = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=24
)
contents = st.one_of(
    texts,
    st.lists(st.builds(lambda text: {"type": "text", "text": text}, texts), min_size=1, max_size=2),
)
EXTRAS = {
    "refusal": st.one_of(st.none(), texts),
    "reasoning_content": texts,
    "annotations": st.lists(
        st.fixed_dictionaries({"type": st.just("note"), "text": texts}), max_size=2
    ),
}


@st.composite
def scripts(draw: st.DrawFn) -> tuple[str | None, list[list[dict[str, Any]]]]:
    """A system prompt (or none) and the batches appended after it: a valid conversation
    cut into batches of 1 to 4 messages."""
    system = draw(st.one_of(st.none(), texts))
    messages: list[dict[str, Any]] = []
    if system is None and draw(st.booleans()):  # appended first: the leading message
        messages.append({"role": draw(st.sampled_from(LEADING_ROLES)), "content": draw(texts)})
    pending: list[str] = []  # calls requested, not answered yet
    for number in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "calls", "results", "note"]))
        if kind == "user":
            message = {"role": "user", "content": draw(contents)}
            if draw(st.booleans()):
                message["name"] = draw(texts)
        elif kind == "assistant":
            message = {"role": "assistant", "content": draw(texts)}
            message.update(draw(st.fixed_dictionaries({}, optional=EXTRAS)))
        elif kind == "calls":
            ids = [f"call_{number}_{index}" for index in range(draw(st.integers(1, 3)))]
            calls = [tool_call(call_id, draw(texts), draw(texts)) for call_id in ids]
            message = {"role": "assistant", "content": draw(st.none() | texts), "tool_calls": calls}
            pending.extend(ids)
        elif kind == "results" and pending:
            for call_id in draw(st.permutations(pending))[: draw(st.integers(1, len(pending)))]:
                messages.append(tool_result(call_id, draw(contents)))
                pending.remove(call_id)
            continue
        else:  # a system or developer message inside the history
            message = {"role": draw(st.sampled_from(LEADING_ROLES)), "content": draw(texts)}
        messages.append(message)
    batches = []
    while messages:
        size = draw(st.integers(1, 4))
        batches.append(messages[:size])
        messages = messages[size:]
    return system, batches


def one_statement(batch: list[dict[str, Any]]) -> bool:
    """Whether ``_append`` takes the one statement for ``batch`` (no Idempotency-Key)."""
    if batch[0]["role"] in LEADING_ROLES:  # it could be the leading message
        return False
    return not any(message["role"] == "tool" for message in batch)


def fields(instance: Any) -> dict[str, Any]:
    return {field.attname: getattr(instance, field.attname) for field in instance._meta.fields}


def stored(conversation: Conversation) -> dict[str, Any]:
    """Everything an append writes for ``conversation``, but ids and timestamps."""
    row = Conversation.objects.filter(pk=conversation.pk).values().get()
    messages = Message.objects.filter(conversation=conversation).order_by("seq").values()
    calls = (
        ToolCall.objects.filter(conversation=conversation)
        .order_by("seq", "call_id")
        .values("message__seq", *(field.attname for field in ToolCall._meta.concrete_fields))
    )
    return {
        "conversation": {key: value for key, value in row.items() if key not in OWN | {"title"}},
        "messages": [{k: v for k, v in message.items() if k not in OWN} for message in messages],
        "calls": [{k: v for k, v in call.items() if k not in OWN} for call in calls],
    }


def append_through_the_transaction(
    conversation: Conversation, batch: list[dict[str, Any]]
) -> list[Message]:
    """``message_append``'s work on the path it would not take for ``batch`` on PostgreSQL."""
    cleaned = messages_clean(batch)
    counts = messages_count(conversation, cleaned)
    locked, rows, _ = _in_transaction(conversation, cleaned, counts, db="default", key=None)
    conversation.update_from(locked)
    return rows


@hypothesis_settings(
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=scripts())
def test_both_paths_store_the_same_rows(script):
    system, batches = script
    owner, _ = get_user_model().objects.get_or_create(username="differential")
    fast = conversation_create(owner=owner, title="one statement", system=system)
    slow = conversation_create(owner=owner, title="transaction", system=system)
    for batch in batches:
        with CaptureQueriesContext(connection) as captured:
            fast_rows = message_append(conversation=fast, messages=batch).messages
        assert (len(captured) == 1) == one_statement(batch), captured.captured_queries
        slow_rows = append_through_the_transaction(slow, batch)

        for conversation, rows in ((fast, fast_rows), (slow, slow_rows)):
            assert fields(conversation) == fields(Conversation.objects.get(pk=conversation.pk))
            for row in rows:
                assert fields(row) == fields(Message.objects.get(pk=row.pk))
        assert [(row.seq, row.is_leading) for row in fast_rows] == [
            (row.seq, row.is_leading) for row in slow_rows
        ]
    assert stored(fast) == stored(slow)
