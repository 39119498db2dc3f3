"""The append's path (services/append_claim.py, services/inserts.py): one UPDATE locks the
conversation row, moves its counters and returns it; the tool-result checks and the INSERT
follow under that lock, in the same transaction.

What it must keep: seqs gapless and counters exact after any mix of batches; a refused
batch leaves the row, its counters and revision as they were; a conversation that is gone
is Conversation.DoesNotExist (404 over REST), even when it is deleted while the append waits
for the row; the objects handed back equal what the database holds. On PostgreSQL, threads
appending to one conversation get disjoint, consecutive seq ranges. That PostgreSQL's one
statement stores what the transaction would: tests/test_append_differential.py.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Count, Sum

from ctxsum.exceptions import MessagesInvalid
from ctxsum.models import Conversation, Message, ToolCall
from ctxsum.services import conversation_create, conversation_delete, message_append
from ctxsum.signals import messages_appended
from ctxsum.validation import TOOL_CALL_ID_ANSWERED, TOOL_CALL_ID_ARCHIVED, TOOL_CALL_ID_UNKNOWN
from tests.factories import (
    assistant_calls,
    assistant_message,
    compacted_conversation,
    tool_result,
    user_message,
    weather_history,
)
from tests.invariants import assert_context_invariants
from tests.postgres import POSTGRES, blocked, start, wait_until
from tests.support.urls import api_url

# Plain messages, parallel tool calls, their results, a call and its result in one batch,
# content parts, a name and a provider extra.
BATCHES: list[list[dict[str, Any]]] = [
    [user_message("Where are my two parcels?")],
    [assistant_calls("call_a", "call_b", name="track")],
    [tool_result("call_a", "Shipped from Porto."), tool_result("call_b", "In Lisbon.")],
    [assistant_message("One shipped, one is in Lisbon."), user_message("And the third?")],
    [
        assistant_calls("call_c", name="track", arguments='{"parcel": 3}'),
        tool_result("call_c", "Lost."),
        assistant_message("The third was lost.", refusal=None),
    ],
    [user_message([{"type": "text", "text": "Ñandú 🦤, please."}], name="ana")],
]
COUNTERS = ("next_seq", "message_count", "active_message_count", "active_tokens", "revision")


def row_values(conversation: Conversation) -> dict[str, Any]:
    return Conversation.objects.filter(pk=conversation.pk).values().get()


def fields(instance: Any) -> dict[str, Any]:
    return {field.attname: getattr(instance, field.attname) for field in instance._meta.fields}


def assert_counters_match_rows(conversation: Conversation) -> list[Message]:
    """The counters against the rows, for a conversation with nothing archived."""
    conversation = Conversation.objects.get(pk=conversation.pk)
    rows = list(Message.objects.filter(conversation=conversation).order_by("seq"))
    totals = Message.objects.filter(conversation=conversation).aggregate(
        count=Count("id"), tokens=Sum("token_count")
    )
    assert [row.seq for row in rows] == list(range(len(rows)))
    assert conversation.next_seq == conversation.message_count == len(rows)
    assert conversation.active_message_count == totals["count"]
    assert conversation.active_tokens == totals["tokens"]
    return rows


# --------------------------------------------------------------------------- one writer


@pytest.mark.django_db
def test_mixed_batches_get_gapless_seqs_and_exact_counters(user):
    conversation = conversation_create(owner=user, system="You track parcels.")
    sent = [{"role": "system", "content": "You track parcels."}]
    for batch in BATCHES:
        before = {name: getattr(conversation, name) for name in COUNTERS}
        rows = message_append(conversation=conversation, messages=batch).messages
        sent.extend(batch)

        start_seq = before["next_seq"]
        assert [row.seq for row in rows] == list(range(start_seq, start_seq + len(batch)))
        assert conversation.next_seq == conversation.message_count == start_seq + len(batch)
        added = sum(row.token_count for row in rows)
        assert conversation.active_message_count == before["active_message_count"] + len(batch)
        assert conversation.active_tokens == before["active_tokens"] + added
        assert conversation.revision == before["revision"] + 1
        assert not any(row.is_leading for row in rows)

    assert_context_invariants(conversation, original_messages=sent)
    assert_counters_match_rows(conversation)
    index = ToolCall.objects.filter(conversation=conversation).order_by("seq", "call_id")
    assert [(call.call_id, call.seq, call.message.seq) for call in index] == [
        ("call_a", 2, 2),
        ("call_b", 2, 2),
        ("call_c", 7, 7),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["system", "developer"])
def test_a_first_message_appended_as_system_is_the_leading_one(user, role):
    # On PostgreSQL too, where a leading message keeps the append's transaction.
    conversation = conversation_create(owner=user)
    rows = message_append(
        conversation=conversation,
        messages=[{"role": role, "content": "Be brief."}, user_message("Hi")],
    ).messages
    assert [(row.seq, row.is_leading) for row in rows] == [(0, True), (1, False)]
    assert_context_invariants(conversation)


def _answered(user: Any) -> tuple[Conversation, list[dict[str, Any]]]:
    conversation = conversation_create(owner=user, messages=weather_history())
    return conversation, [tool_result("call_delhi", "again")]


def _unknown(user: Any) -> tuple[Conversation, list[dict[str, Any]]]:
    conversation = conversation_create(owner=user, messages=weather_history())
    # A valid message first: the whole batch is refused, not only the bad result.
    return conversation, [user_message("One more."), tool_result("call_nowhere", "?")]


def _archived(user: Any) -> tuple[Conversation, list[dict[str, Any]]]:
    conversation = compacted_conversation(
        user, messages=weather_history(), keep={"messages": 2}, trigger={"messages": 6}
    )
    return conversation, [tool_result("call_mumbai", "late")]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("build", "refusal", "index"),
    [
        (_answered, TOOL_CALL_ID_ANSWERED, 0),
        (_unknown, TOOL_CALL_ID_UNKNOWN, 1),
        (_archived, TOOL_CALL_ID_ARCHIVED, 0),
    ],
    ids=["answered", "unknown", "archived"],
)
def test_a_refused_tool_result_leaves_everything_as_it_was(user, build, refusal, index):
    conversation, batch = build(user)
    call_id = batch[index]["tool_call_id"]
    before_row = row_values(conversation)
    before_instance = fields(conversation)
    before_messages = list(Message.objects.filter(conversation=conversation).values())
    before_calls = list(ToolCall.objects.filter(conversation=conversation).values())

    with pytest.raises(MessagesInvalid) as refused:
        message_append(conversation=conversation, messages=batch)

    assert refused.value.per_message[index] == {"tool_call_id": [refusal.format(id=call_id)]}
    assert row_values(conversation) == before_row  # counters, revision and updated_at
    assert fields(conversation) == before_instance
    assert list(Message.objects.filter(conversation=conversation).values()) == before_messages
    assert list(ToolCall.objects.filter(conversation=conversation).values()) == before_calls
    # The seqs the refused batch would have taken are the next append's.
    rows = message_append(conversation=conversation, messages=[user_message("Next.")]).messages
    assert rows[0].seq == before_row["next_seq"]
    assert conversation.revision == before_row["revision"] + 1
    assert_context_invariants(conversation)


@pytest.mark.django_db
def test_appending_to_a_deleted_conversation_is_does_not_exist(user):
    conversation = conversation_create(owner=user, messages=[user_message("Hi")])
    pk = conversation.pk
    conversation_delete(conversation=conversation)

    with pytest.raises(Conversation.DoesNotExist):
        message_append(conversation=conversation, messages=[user_message("Still there?")])
    assert not Conversation.objects.filter(pk=pk).exists()
    assert not Message.objects.filter(conversation_id=pk).exists()


@pytest.mark.django_db
def test_appending_to_a_deleted_conversation_over_rest_is_404(api, user):
    conversation = conversation_create(owner=user)
    url = api_url("message-list", conversation)
    conversation_delete(conversation=conversation)

    response = api.post(url, user_message("Still there?"), format="json")

    assert response.status_code == 404
    assert response.json() == {"detail": "No such conversation.", "code": "not_found"}


@pytest.mark.django_db
def test_what_an_append_hands_back_equals_a_fresh_read(user, django_capture_on_commit_callbacks):
    conversation = conversation_create(
        owner=user,
        title="Parcels",
        metadata={"team": "ops", "tags": ["a", "ñ"]},
        trigger={"messages": 50},
        keep={"messages": 4},
        max_context_tokens=5000,
        messages=BATCHES[0],
    )
    signalled: list[tuple[Conversation, list[Message]]] = []

    def receiver(sender: Any, conversation: Conversation, messages: list[Message], **_: Any):
        signalled.append((conversation, messages))

    messages_appended.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            appended = [
                message_append(conversation=conversation, messages=batch).messages
                for batch in BATCHES[1:]
            ]
    finally:
        messages_appended.disconnect(receiver)

    fresh = Conversation.objects.get(pk=conversation.pk)
    assert fields(conversation) == fields(fresh)
    for rows in appended:
        for row in rows:
            assert row.pk is not None and not row._state.adding
            assert fields(row) == fields(Message.objects.get(pk=row.pk))
    assert [messages for _, messages in signalled] == appended
    last, _ = signalled[-1]
    assert fields(last) == fields(fresh)


# --------------------------------------------------------------------------- PostgreSQL


def on_postgres(test: Any) -> Any:
    """The marks of the PostgreSQL tests (tests/postgres.py), for one test of this module."""
    for mark in POSTGRES:
        test = mark(test)
    return test


THREADS = 8
ROUNDS = 6


def _writer(pk: Any, index: int, *, together: threading.Barrier) -> list[list[int]]:
    """One writer's rounds: a question, a tool call, its result, an answer with the next
    question; the seqs of each batch."""
    conversation = Conversation.objects.get(pk=pk)
    together.wait(timeout=30)
    seqs = []
    for number in range(ROUNDS):
        call_id = f"call_{index}_{number}"
        for batch in (
            [user_message(f"w{index} r{number} question")],
            [assistant_calls(call_id, name="f")],
            [tool_result(call_id, "ok")],
            [assistant_message(f"w{index} r{number} answer"), user_message("next")],
        ):
            rows = message_append(conversation=conversation, messages=batch).messages
            seqs.append([row.seq for row in rows])
    return seqs


@on_postgres
def test_threads_appending_to_one_conversation_get_disjoint_consecutive_seqs(user):
    conversation = conversation_create(owner=user, system="Count.")
    together = threading.Barrier(THREADS)
    work = partial(_writer, conversation.pk, together=together)
    workers = [start(partial(work, index)) for index in range(THREADS)]
    batches = [seqs for worker in workers for seqs in worker.outcome(timeout=120)]

    for seqs in batches:
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # each batch contiguous
    handed_out = sorted(seq for seqs in batches for seq in seqs)
    assert handed_out == list(range(1, 1 + THREADS * ROUNDS * 5))  # disjoint, no gaps
    rows = assert_counters_match_rows(conversation)
    fresh = Conversation.objects.get(pk=conversation.pk)
    assert fresh.revision == 1 + len(batches)
    assert ToolCall.objects.filter(conversation=conversation).count() == THREADS * ROUNDS
    requested = {row.tool_calls[0]["id"]: row.seq for row in rows if row.tool_calls}
    for row in rows:
        if row.role == "tool":
            assert requested[row.tool_call_id] < row.seq
    assert_context_invariants(conversation)


@on_postgres
def test_an_append_waiting_behind_a_delete_finds_the_conversation_gone(user):
    conversation = conversation_create(owner=user, messages=[user_message("Hi")])
    pk = conversation.pk

    with transaction.atomic():
        Conversation.objects.select_for_update().get(pk=pk)  # what a delete does first
        worker = start(
            lambda: message_append(
                conversation=Conversation.objects.get(pk=pk), messages=[user_message("Hello?")]
            )
        )
        assert wait_until(lambda: blocked(worker.pid)), "the append never waited for the row"
        conversation_delete(conversation=conversation)

    with pytest.raises(Conversation.DoesNotExist):
        worker.outcome()
    assert not Message.objects.filter(conversation_id=pk).exists()


# Plain messages whose text is hard to carry in a statement's literals: quotes, backslashes,
# placeholders, a JSON-looking string, and content parts.
AWKWARD = [
    user_message("It's 100% \"done\"\\n, isn't it? %s %(name)s $1 ::jsonb"),
    assistant_message('{"not": "json"}', refusal=None),
    user_message([{"type": "text", "text": "Ñandú 🦤 'quoted' \\ %"}], name="o'neil"),
]


def statements(captured: Any) -> list[str]:
    return [query["sql"].split(" ", 1)[0] for query in captured.captured_queries]


@on_postgres
def test_plain_messages_are_one_statement_with_no_transaction(user):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    conversation = conversation_create(owner=user, system="You track parcels.")
    with CaptureQueriesContext(connection) as captured:
        rows = message_append(conversation=conversation, messages=AWKWARD).messages
    assert statements(captured) == ["WITH"]
    assert [row.seq for row in rows] == [1, 2, 3]
    for row in rows:
        assert fields(row) == fields(Message.objects.get(pk=row.pk))
    assert [row.content for row in rows] == [message["content"] for message in AWKWARD]
    assert rows[2].name == "o'neil" and rows[1].extra == {"refusal": None}
    assert fields(conversation) == fields(Conversation.objects.get(pk=conversation.pk))
    assert_counters_match_rows(conversation)

    # Tool calls too, their index rows in the same statement; a tool result, checked under
    # the row lock, takes the transaction.
    calls = [
        assistant_calls("call_a", "call_b", name="track"),
        user_message("And?"),
        assistant_calls("call_c", name="it's"),
    ]
    with CaptureQueriesContext(connection) as captured:
        rows = message_append(conversation=conversation, messages=calls).messages
    assert statements(captured) == ["WITH"]
    index = ToolCall.objects.filter(conversation=conversation).order_by("seq", "call_id")
    assert [(call.call_id, call.name, call.seq, call.message_id) for call in index] == [
        ("call_a", "track", 4, rows[0].pk),
        ("call_b", "track", 4, rows[0].pk),
        ("call_c", "it's", 6, rows[2].pk),
    ]
    with CaptureQueriesContext(connection) as captured:
        message_append(conversation=conversation, messages=[tool_result("call_a", "Shipped.")])
    assert statements(captured) == ["BEGIN", "UPDATE", "SELECT", "INSERT", "COMMIT"]
    assert_counters_match_rows(conversation)
    assert_context_invariants(conversation)


@on_postgres
def test_a_full_batch_is_one_statement_with_contiguous_seqs(user):
    conversation = conversation_create(owner=user, messages=[user_message("Hi")])
    batch = [user_message(f"m{number}") for number in range(1000)]  # MAX_BATCH_MESSAGES
    rows = message_append(conversation=conversation, messages=batch).messages
    assert [row.seq for row in rows] == list(range(1, 1001))
    stored = Message.objects.filter(conversation=conversation, seq__gte=1).order_by("seq")
    assert [(row.pk, row.content) for row in stored] == [(row.pk, row.content) for row in rows]
    assert not any(row.is_leading for row in stored)
    assert_counters_match_rows(conversation)


@on_postgres
def test_the_one_statement_refuses_a_value_too_long_for_its_column(user):
    # Below validation (which caps every field first): the statement's VALUES must not cut a
    # value to its column's length, as an explicit cast to varchar(n) would.
    from django.db import DataError

    from ctxsum.services.append_claim import append_claim_insert

    conversation = conversation_create(owner=user, messages=[user_message("Hi")])
    before = row_values(conversation)
    row = Message(conversation=conversation, seq=0, role="user", content="x", token_count=1)
    row.name = "n" * 101  # the column is varchar(100)
    with pytest.raises(DataError, match="too long"):
        append_claim_insert(pk=conversation.pk, db="default", rows=[row], tokens=1)
    assert row_values(conversation) == before
    assert Message.objects.filter(conversation=conversation).count() == 1
