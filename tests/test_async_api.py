"""The async API (``amessage_append``, ``acontext_get``, ``aconversation_compact``,
``achat_turn``) against a local OpenAI-compatible server: the same rows, invariants and
failures as the sync API, with the summarizer and the chat model called through
``openai.AsyncOpenAI`` (its User-Agent says so). The tests are sync and drive the
coroutines with ``async_to_sync``, so the database work runs in the test's thread and sees
its transaction."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync

from ctxsum.chat.models import ChatState, ChatTurn
from ctxsum.chat.services import ChatResult, ChatStream, achat_turn, chat_turn
from ctxsum.exceptions import SummarizerError
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import acontext_get, context_get
from ctxsum.services import (
    aconversation_compact,
    amessage_append,
    conversation_compact,
    conversation_create,
)
from tests.factories import long_user_message, user_message
from tests.invariants import assert_context_invariants

pytestmark = pytest.mark.django_db

POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
HISTORY = [long_user_message(f"u{n}") for n in range(5)]


@pytest.fixture
def conversation(user) -> Conversation:
    return conversation_create(owner=user, system="Be brief.", messages=HISTORY, **POLICY)


def agents(server: Any) -> list[str]:
    """The User-Agent of every request the server received."""
    return [request["headers"].get("user-agent", "") for request in server.requests]


def stored(conversation: Conversation) -> list[tuple[int, str]]:
    return list(
        Message.objects.filter(conversation=conversation).values_list("seq", "role").order_by("seq")
    )


def test_an_async_append_stores_what_the_sync_one_does(user):
    first = conversation_create(owner=user, system="Be brief.")
    messages = [user_message("Hello"), {"role": "assistant", "content": "Hi."}]

    appended = async_to_sync(amessage_append)(conversation=first, messages=messages)

    assert [row.seq for row in appended.messages] == [1, 2]
    assert first.message_count == 3  # the caller's instance brought up to date
    context = async_to_sync(acontext_get)(conversation=first)
    assert context.messages == context_get(conversation=first).messages
    assert [m["content"] for m in context.messages] == ["Be brief.", "Hello", "Hi."]
    assert_context_invariants(first)


def test_an_async_compaction_calls_the_summarizer_through_the_async_client(
    conversation, openai_summarizer
):
    result = async_to_sync(aconversation_compact)(conversation=conversation)

    assert result.compacted and result.summary is not None
    assert result.summary.version == 1 and result.context is not None
    assert [m.seq for m in result.archived] == [1, 2, 3]
    assert agents(openai_summarizer) and all(
        a.startswith("AsyncOpenAI/") for a in agents(openai_summarizer)
    )
    conversation.refresh_from_db()
    assert conversation.lease_owner == ""
    assert_context_invariants(conversation)


def test_the_async_and_the_sync_compaction_write_the_same_rows(user, openai_summarizer):
    sync_one = conversation_create(owner=user, system="Be brief.", messages=HISTORY, **POLICY)
    async_one = conversation_create(owner=user, system="Be brief.", messages=HISTORY, **POLICY)

    conversation_compact(conversation=sync_one)
    async_to_sync(aconversation_compact)(conversation=async_one)

    def shape(conversation: Conversation) -> Any:
        summary = Summary.objects.get(conversation=conversation)
        conversation.refresh_from_db()
        return (
            summary.text,
            summary.from_seq,
            summary.to_seq,
            summary.token_count,
            conversation.active_tokens,
            conversation.archived_message_count,
            list(
                Message.objects.filter(conversation=conversation).values_list(
                    "seq", "summary__version"
                )
            ),
        )

    assert shape(sync_one) == shape(async_one)


def test_a_failed_async_compaction_changes_nothing_and_records_why(conversation, openai_summarizer):
    openai_summarizer.mode = "error"
    before = stored(conversation), Conversation.objects.get(pk=conversation.pk).revision

    with pytest.raises(SummarizerError):
        async_to_sync(aconversation_compact)(conversation=conversation)

    row = Conversation.objects.get(pk=conversation.pk)
    assert (stored(conversation), row.revision) == before
    assert row.lease_owner == "" and not Summary.objects.filter(conversation=row).exists()
    attempt = CompactionAttempt.objects.get(conversation=row)
    assert attempt.outcome == CompactionAttempt.Outcome.FAILED


def test_an_async_compaction_below_its_trigger_calls_nothing(user, openai_summarizer):
    short = conversation_create(owner=user, messages=[user_message("Hi")], **POLICY)

    result = async_to_sync(aconversation_compact)(conversation=short)

    assert (result.compacted, result.reason) == (False, Reason.BELOW_TRIGGER)
    assert openai_summarizer.requests == []


def test_an_async_append_over_its_trigger_compacts_through_the_async_client(
    user, openai_summarizer, settings
):
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "sync"}
    conversation = conversation_create(
        owner=user, system="Be brief.", messages=HISTORY[:4], **POLICY
    )

    appended = async_to_sync(amessage_append)(conversation=conversation, messages=[HISTORY[4]])

    assert appended.compaction is not None and appended.compaction.compacted
    assert agents(openai_summarizer) and all(
        a.startswith("AsyncOpenAI/") for a in agents(openai_summarizer)
    )
    assert_context_invariants(conversation)


def test_an_async_turn_stores_the_reply_as_the_sync_turn_does(conversation, chat_model):
    chat_model.reply = "Noted."

    result = async_to_sync(achat_turn)(conversation=conversation, message=user_message("And?"))

    assert isinstance(result, ChatResult)
    assert [m.content for m in result.messages] == ["And?", "Noted."]
    # The context was at its trigger with the new message: compacted first, both async.
    assert result.compaction is not None and result.compaction.compacted
    assert all(a.startswith("AsyncOpenAI/") for a in agents(chat_model))
    turn = ChatTurn.objects.get(conversation=conversation)
    assert (turn.streamed, turn.finish_reason) == (False, "stop")
    assert ChatState.objects.get(pk=conversation.pk).turn_owner == ""
    assert_context_invariants(conversation)


def test_an_async_stream_yields_the_chunks_then_the_stored_result(conversation, chat_model):
    chat_model.reply = "One two three."

    async def run() -> list[Any]:
        stream = await achat_turn(
            conversation=conversation, message=user_message("Count."), stream=True
        )
        assert isinstance(stream, ChatStream)
        return [event async for event in stream]

    events = async_to_sync(run)()

    chunks, result = events[:-1], events[-1]
    assert isinstance(result, ChatResult)
    text = "".join(
        choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"]
    )
    assert text == "One two three." == result.messages[-1].content
    assert ChatTurn.objects.get(conversation=conversation).streamed
    assert_context_invariants(conversation)


def test_an_async_stream_closed_early_stores_nothing_and_frees_the_turn(conversation, chat_model):
    chat_model.reply = "One two three."
    before = stored(conversation)

    async def run() -> None:
        stream = await achat_turn(
            conversation=conversation, message=user_message("Count."), stream=True
        )
        await anext(stream)
        await stream.aclose()

    async_to_sync(run)()

    assert stored(conversation) == before
    assert not ChatTurn.objects.filter(conversation=conversation).exists()
    assert ChatState.objects.get(pk=conversation.pk).turn_owner == ""
    # The turn can be taken again at once.
    chat_turn(conversation=conversation, message=user_message("Again."))
    assert ChatTurn.objects.filter(conversation=conversation).count() == 1


def test_an_async_turn_that_fails_gives_its_reservation_back(conversation, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_RETRIES": 0}
    chat_model.model_status = {"gpt-4o": 400}
    before = stored(conversation)

    with pytest.raises(Exception) as raised:
        async_to_sync(achat_turn)(conversation=conversation, message=user_message("And?"))

    assert type(raised.value).__name__ == "ModelError"
    assert ChatState.objects.get(pk=conversation.pk).turn_owner == ""
    assert not ChatTurn.objects.filter(conversation=conversation).exists()
    # The compaction before the call stands (it archived, never added); the turn's
    # message is not stored.
    assert stored(conversation) == before
