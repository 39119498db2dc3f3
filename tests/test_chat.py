"""The chat turn as a service (``services.chat_turn``), against a local OpenAI-compatible
server through the real openai client: the order of its steps (limit, compaction, ceiling,
model call with retries and fallbacks, one commit), streaming, tool-call rounds, and that a
failed turn stores nothing and gives its reservation back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from ctxsum.chat.exceptions import CallLimitReached, ContextTooLong, ModelError, TurnInProgress
from ctxsum.chat.models import ChatCallDay, ChatState, ChatTurn
from ctxsum.chat.services import ChatResult, ChatStream, chat_turn
from ctxsum.exceptions import MessagesInvalid, SummarizerError
from ctxsum.models import Conversation, Message
from ctxsum.selectors import context_get, conversation_stats
from ctxsum.services import conversation_create, message_append
from tests import query_budgets as budget
from tests.factories import (
    long_user_message,
    tool_call,
    tool_result,
    user_message,
)
from tests.invariants import assert_context_invariants
from tests.openai_server import fake_summary

pytestmark = pytest.mark.django_db

POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
HISTORY = [long_user_message(f"u{n}") for n in range(4)]


@pytest.fixture
def conversation(user) -> Conversation:
    return conversation_create(owner=user, system="Be brief.", messages=HISTORY[:2], **POLICY)


def chat_requests(server) -> list[dict[str, Any]]:
    """The bodies of the chat model's requests (the summarizer's name its model)."""
    return [body for body in server.bodies if body["model"] != "summary-model-1"]


def summary_requests(server) -> list[dict[str, Any]]:
    return [body for body in server.bodies if body["model"] == "summary-model-1"]


def state(conversation: Conversation) -> dict[str, Any]:
    """What a failed turn must leave as it was, and the reservation's counters."""
    row = Conversation.objects.get(pk=conversation.pk)
    return {
        "messages": list(Message.objects.filter(conversation=row).values_list("seq", "content")),
        "revision": row.revision,
        "turns": ChatTurn.objects.filter(conversation=row).count(),
        "chat_calls": ChatState.objects.get(pk=row.pk).chat_calls,
        "turn_owner": ChatState.objects.get(pk=row.pk).turn_owner,
    }


def assert_nothing_stored(conversation: Conversation, before: dict[str, Any]) -> None:
    after = state(conversation)
    assert after == before, "the failed turn changed the conversation"
    assert after["turn_owner"] == "" and after["chat_calls"] == before["chat_calls"]


# --------------------------------------------------------------------------- a turn


def test_a_turn_sends_the_context_and_the_message_and_stores_both(conversation, chat_model):
    chat_model.reply = "Hello there."
    chat_model.cached_tokens = 7
    context = context_get(conversation=conversation).messages

    result = chat_turn(conversation=conversation, message=user_message("Hi!"))

    (body,) = chat_requests(chat_model)
    assert body["messages"] == [*context, user_message("Hi!")]
    assert body["model"] == "gpt-4o"
    assert "stream" not in body and "tools" not in body
    assert chat_model.requests[0]["headers"]["authorization"] == "Bearer chat-key"
    question, reply = result.messages
    assert (question.seq, reply.seq) == (3, 4)
    assert reply.as_openai() == {"role": "assistant", "content": "Hello there."}
    assert context_get(conversation=conversation).messages[-2:] == [
        user_message("Hi!"),
        {"role": "assistant", "content": "Hello there."},
    ]
    turn = result.turn
    assert (turn.message, turn.reply, turn.model, turn.requested_model) == (
        question,
        reply,
        "gpt-4o",
        "gpt-4o",
    )
    assert (turn.attempts, turn.fallbacks, turn.streamed) == (1, 0, False)
    assert turn.cached_tokens == 7 and turn.prompt_tokens > 0 and turn.completion_tokens > 0
    assert turn.total_tokens == turn.prompt_tokens + turn.completion_tokens
    assert result.compaction is None
    conversation.refresh_from_db()
    chat_state = ChatState.objects.get(pk=conversation.pk)
    assert (chat_state.chat_calls, chat_state.turn_owner) == (1, "")
    stats = conversation_stats(conversation=conversation)
    assert (stats["chat_turns"], stats["cached_tokens"]) == (1, 7)
    assert stats["prompt_tokens"] == turn.prompt_tokens


def test_the_options_are_passed_on(conversation, chat_model):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    chat_turn(
        conversation=conversation,
        message=user_message("Weather?"),
        model="gpt-4.1-mini",
        tools=tools,
        tool_choice="auto",
        temperature=0.3,
        max_completion_tokens=50,
    )

    (body,) = chat_requests(chat_model)
    assert body["model"] == "gpt-4.1-mini"
    assert (body["tools"], body["tool_choice"]) == (tools, "auto")
    assert (body["temperature"], body["max_completion_tokens"]) == (0.3, 50)


BAD_INPUT = [
    ({"message": {"role": "system", "content": "obey"}}, "role"),
    ({"message": {"role": "assistant", "content": "hi"}}, "role"),
    ({"message": {"role": "user", "content": None}}, "content"),
    ({"message": {"role": "user", "content": "hi", "extra": 1}}, "extra"),
    ({"message": {"role": "tool", "tool_call_id": "call_nobody", "content": "x"}}, "tool_call_id"),
    ({"temperature": 3}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_completion_tokens": True}, "max_completion_tokens"),
    ({"tools": []}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"model": ""}, "model"),
    ({"model": "a\x00b"}, "model"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]},
        "tools",
    ),
]


@pytest.mark.parametrize(("fields", "field"), BAD_INPUT, ids=[f for _, f in BAD_INPUT])
def test_bad_input_is_refused_before_anything_happens(conversation, chat_model, fields, field):
    before = state(conversation)
    arguments = {"message": user_message("Hi"), **fields}

    with pytest.raises(ValidationError) as refused:
        chat_turn(conversation=conversation, **arguments)

    errors = (
        refused.value.per_message[0]
        if isinstance(refused.value, MessagesInvalid)
        else refused.value.message_dict
    )
    assert field in errors, errors
    assert chat_model.requests == []
    assert_nothing_stored(conversation, before)


def test_message_null_needs_something_to_answer(user, chat_model):
    empty = conversation_create(owner=user)
    with pytest.raises(MessagesInvalid):
        chat_turn(conversation=empty, message=None)
    assert chat_model.requests == []


# --------------------------------------------------------------------------- limits, in order


def over_trigger(user) -> Conversation:
    """A conversation whose next message reaches the trigger: the turn compacts first."""
    return conversation_create(owner=user, system="Be brief.", messages=HISTORY, **POLICY)


def test_the_summary_call_comes_first_and_is_not_counted(user, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_MAX_CALLS_PER_CONVERSATION": 1}
    conversation = over_trigger(user)

    result = chat_turn(conversation=conversation, message=long_user_message("u4"))

    assert [body["model"] for body in chat_model.bodies] == ["summary-model-1", "gpt-4o"]
    assert result.compaction is not None and result.compaction.compacted
    assert result.compaction.summary_version == 1
    # The compacted context went to the model: the summary, then the kept messages.
    sent = chat_requests(chat_model)[0]["messages"]
    assert sent[1]["content"].endswith(
        fake_summary(summary_requests(chat_model)[0]["messages"][1]["content"])
    )
    assert sent[-1] == long_user_message("u4")
    conversation.refresh_from_db()
    # The summary call took none of the one allowed.
    assert ChatState.objects.get(pk=conversation.pk).chat_calls == 1


def test_with_the_limit_used_up_neither_summary_nor_model_is_called(user, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_MAX_CALLS_PER_CONVERSATION": 1}
    conversation = conversation_create(owner=user, messages=HISTORY[:1], **POLICY)
    chat_turn(conversation=conversation, message=user_message("one"))
    message_append(conversation=conversation, messages=HISTORY[1:4])  # now over the trigger
    chat_model.reset()
    before = state(conversation)

    with pytest.raises(CallLimitReached) as refused:
        chat_turn(conversation=conversation, message=user_message("two"))

    assert refused.value.scope == "conversation"
    assert chat_model.requests == []
    assert_nothing_stored(conversation, before)


def test_a_failed_turn_gives_its_reservation_back(conversation, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_MAX_CALLS_PER_CONVERSATION": 1}
    chat_model.model_status = {"gpt-4o": 400}
    before = state(conversation)

    with pytest.raises(ModelError):
        chat_turn(conversation=conversation, message=user_message("Hi"))

    assert_nothing_stored(conversation, before)
    chat_model.model_status = {}
    assert chat_turn(conversation=conversation, message=user_message("Hi")).turn.attempts == 1


def test_calls_per_user_per_day(user, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_MAX_CALLS_PER_USER_PER_DAY": 2}
    first, second = (conversation_create(owner=user) for _ in range(2))
    chat_turn(conversation=first, message=user_message("a"), user=user)
    chat_turn(conversation=second, message=user_message("b"), user=user)
    before = state(first)

    with pytest.raises(CallLimitReached) as refused:
        chat_turn(conversation=first, message=user_message("c"), user=user)

    assert refused.value.scope == "user_day"
    assert len(chat_model.requests) == 2
    assert_nothing_stored(first, before)
    # The conversation's reservation was undone with the day's: nothing counted twice.
    assert ChatCallDay.objects.get(user=user).calls == 2
    # Yesterday's calls do not count today.
    ChatCallDay.objects.filter(user=user).update(day=timezone.now().date() - timedelta(days=1))
    chat_turn(conversation=first, message=user_message("c"), user=user)


def test_a_conversation_gets_its_chat_state_when_made_or_at_its_first_turn(user, chat_model):
    made = conversation_create(owner=user, messages=HISTORY[:1])
    assert ChatState.objects.filter(pk=made.pk).exists()
    # A conversation older than the app has none until its first turn makes it.
    ChatState.objects.filter(pk=made.pk).delete()

    chat_turn(conversation=made, message=user_message("Hi"))

    assert (chat_state := ChatState.objects.get(pk=made.pk)).chat_calls == 1
    assert chat_state.turn_owner == ""


def test_a_turn_on_a_deleted_conversation_reserves_nothing(user, chat_model):
    gone = conversation_create(owner=user, messages=HISTORY[:1])
    Conversation.objects.filter(pk=gone.pk).delete()

    with pytest.raises(Conversation.DoesNotExist):
        chat_turn(conversation=gone, message=user_message("Hi"))

    assert chat_model.requests == [] and not ChatState.objects.exists()


def test_a_turn_in_progress_refuses_another_until_it_is_stale(conversation, chat_model, settings):
    ChatState.objects.filter(pk=conversation.pk).update(
        turn_owner="other-worker", turn_started_at=timezone.now()
    )
    with pytest.raises(TurnInProgress):
        chat_turn(conversation=conversation, message=user_message("Hi"))
    assert chat_model.requests == []

    stale = timezone.now() - timedelta(seconds=settings.CTXSUM.get("CHAT_TURN_SECONDS", 600) + 1)
    ChatState.objects.filter(pk=conversation.pk).update(turn_started_at=stale)
    result = chat_turn(conversation=conversation, message=user_message("Hi"))
    assert result.turn.reply.content == fake_summary("Hi")


def test_context_too_long_even_after_compaction(user, chat_model):
    conversation = conversation_create(
        owner=user, messages=HISTORY, max_context_tokens=300, **POLICY
    )
    before = state(conversation)
    huge = user_message("word " * 400)

    with pytest.raises(ContextTooLong):
        chat_turn(conversation=conversation, message=huge)

    assert chat_requests(chat_model) == []
    assert len(summary_requests(chat_model)) == 1  # it compacted first
    after = state(conversation)
    assert (after["turns"], after["chat_calls"], after["turn_owner"]) == (0, 0, "")
    assert len(after["messages"]) == len(before["messages"])


# --------------------------------------------------------------------------- retries, fallbacks


def test_a_500_from_the_first_model_falls_back_to_the_second(conversation, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_RETRIES": 1, "CHAT_FALLBACK_MODELS": ["backup"]}
    chat_model.model_status = {"gpt-4o": 500}

    result = chat_turn(conversation=conversation, message=user_message("Hi"))

    assert [body["model"] for body in chat_requests(chat_model)] == ["gpt-4o", "gpt-4o", "backup"]
    turn = result.turn
    assert (turn.model, turn.requested_model, turn.attempts, turn.fallbacks) == (
        "backup",
        "gpt-4o",
        3,
        1,
    )


@pytest.mark.parametrize(("retries", "succeeds"), [(2, True), (1, False)])
def test_a_429_is_retried_as_the_settings_say(
    conversation, chat_model, settings, retries, succeeds
):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_RETRIES": retries}
    chat_model.script = [{"status": 429}, {"status": 429}]
    before = state(conversation)

    if succeeds:
        assert chat_turn(conversation=conversation, message=user_message("Hi")).turn.attempts == 3
    else:
        with pytest.raises(ModelError, match="after 2 attempt"):
            chat_turn(conversation=conversation, message=user_message("Hi"))
        assert_nothing_stored(conversation, before)
    assert len(chat_model.requests) == retries + 1 if succeeds else 2


def test_an_error_that_is_not_transient_is_not_retried(conversation, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_RETRIES": 3, "CHAT_FALLBACK_MODELS": ["backup"]}
    chat_model.model_status = {"gpt-4o": 404, "backup": 401}

    with pytest.raises(ModelError):
        chat_turn(conversation=conversation, message=user_message("Hi"))

    assert [body["model"] for body in chat_model.bodies] == ["gpt-4o", "backup"]


def test_the_summary_call_is_never_retried(user, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_RETRIES": 3, "CHAT_FALLBACK_MODELS": ["backup"]}
    conversation = over_trigger(user)
    chat_model.model_status = {"summary-model-1": 500}
    before = state(conversation)

    with pytest.raises(SummarizerError):
        chat_turn(conversation=conversation, message=long_user_message("u4"))

    assert [body["model"] for body in chat_model.bodies] == ["summary-model-1"]
    assert_nothing_stored(conversation, before)


def test_a_reply_that_is_no_message_falls_back(conversation, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_FALLBACK_MODELS": ["backup"]}
    chat_model.script = [{"reply": None}]  # content null and no tool calls: not a message
    chat_model.mode = "null"
    with pytest.raises(ModelError, match="not a valid message"):
        chat_turn(conversation=conversation, message=user_message("Hi"))
    assert [body["model"] for body in chat_model.bodies] == ["gpt-4o", "backup"]


# --------------------------------------------------------------------------- streaming


def run_stream(stream: ChatStream) -> tuple[list[dict[str, Any]], ChatResult]:
    events = list(stream)
    *chunks, result = events
    assert isinstance(result, ChatResult)
    return chunks, result


def test_a_stream_yields_the_chunks_and_stores_their_concatenation(conversation, chat_model):
    chat_model.reply = "It is sunny in Lisbon today."
    chat_model.stream_pieces = 4
    chat_model.cached_tokens = 3

    chunks, result = run_stream(
        chat_turn(conversation=conversation, message=user_message("Weather?"), stream=True)
    )

    (body,) = chat_requests(chat_model)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    assert len([d for d in deltas if d]) == 4
    assert result.messages[-1].content == "".join(deltas) == "It is sunny in Lisbon today."
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    turn = result.turn
    assert (turn.streamed, turn.finish_reason, turn.cached_tokens) == (True, "stop", 3)
    assert turn.completion_tokens == chunks[-1]["usage"]["completion_tokens"]


def test_a_stream_cut_off_midway_stores_nothing(conversation, chat_model):
    chat_model.drop_after = 3
    before = state(conversation)
    stream = chat_turn(conversation=conversation, message=user_message("Hi"), stream=True)

    received = []
    with pytest.raises(ModelError, match="stream broke off"):
        for event in stream:
            received.append(event)

    assert len(received) >= 1, "the failure came after some chunks"
    assert len(chat_model.requests) == 1  # never retried once a chunk was passed on
    assert_nothing_stored(conversation, before)


def test_a_summary_failure_fails_the_streamed_turn_before_its_first_chunk(user, chat_model):
    conversation = over_trigger(user)
    chat_model.model_status = {"summary-model-1": 500}
    before = state(conversation)

    with pytest.raises(SummarizerError):
        chat_turn(conversation=conversation, message=long_user_message("u4"), stream=True)

    assert chat_requests(chat_model) == []
    assert_nothing_stored(conversation, before)


def test_a_stream_that_fails_to_open_is_retried(conversation, chat_model):
    chat_model.script = [{"status": 503}]
    _, result = run_stream(
        chat_turn(conversation=conversation, message=user_message("Hi"), stream=True)
    )
    assert result.turn.attempts == 2 and len(chat_model.requests) == 2


@pytest.mark.parametrize("started", [False, True])
def test_a_stream_closed_early_gives_its_reservation_back(conversation, chat_model, started):
    before = state(conversation)
    stream = chat_turn(conversation=conversation, message=user_message("Hi"), stream=True)
    assert ChatState.objects.get(pk=conversation.pk).turn_owner  # reserved
    if started:
        next(stream)
    stream.close()
    assert_nothing_stored(conversation, before)


# --------------------------------------------------------------------------- tool calls


def test_a_tool_call_round_trip(conversation, chat_model):
    calls = [tool_call("call_a", "weather", '{"city": "Oslo"}'), tool_call("call_b", "time")]
    chat_model.script = [{"tool_calls": calls}]
    tools = [{"type": "function", "function": {"name": name}} for name in ("weather", "time")]

    first = chat_turn(conversation=conversation, message=user_message("Oslo?"), tools=tools)
    assert first.messages[-1].tool_calls == calls
    assert first.turn.finish_reason == "tool_calls"
    # One result is not enough to go on: the other call would stay unanswered.
    message_append(conversation=conversation, messages=[tool_result("call_a", "12 C")])
    with pytest.raises(MessagesInvalid) as refused:
        chat_turn(conversation=conversation, message=None, tools=tools)
    assert "call_b" in str(refused.value.per_message)
    with pytest.raises(MessagesInvalid):
        chat_turn(conversation=conversation, message=user_message("And?"), tools=tools)
    chat_model.reply = "It is 12 C in Oslo at noon."

    # The last result may come as the turn's message.
    final = chat_turn(conversation=conversation, message=tool_result("call_b", "noon"), tools=tools)

    sent = chat_requests(chat_model)[-1]["messages"]
    assert [m["role"] for m in sent[-4:]] == ["user", "assistant", "tool", "tool"]
    assert final.messages[-1].content == "It is 12 C in Oslo at noon."
    context = context_get(conversation=conversation).messages
    assert_provider_valid(context)
    assert_context_invariants(conversation)


def test_a_streamed_tool_call_is_put_together(conversation, chat_model):
    calls = [tool_call("call_s", "search", '{"query": "hotels in Porto"}')]
    chat_model.script = [{"tool_calls": calls}]
    tools = [{"type": "function", "function": {"name": "search"}}]

    _, result = run_stream(
        chat_turn(conversation=conversation, message=user_message("Find"), tools=tools, stream=True)
    )

    assert result.messages[-1].as_openai() == {
        "role": "assistant",
        "content": None,
        "tool_calls": calls,
    }
    message_append(conversation=conversation, messages=[tool_result("call_s", "3 hotels")])
    chat_turn(conversation=conversation, message=None, tools=tools)
    assert_provider_valid(context_get(conversation=conversation).messages)


def assert_provider_valid(messages: list[dict[str, Any]]) -> None:
    """What a chat completions API checks of a request's history: every tool call answered
    right after its request, every result answering a call of the request before it."""
    pending: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in pending, message
            pending.remove(message["tool_call_id"])
            continue
        assert not pending, f"calls {pending} unanswered before {message}"
        if message["role"] == "assistant":
            pending = [call["id"] for call in message.get("tool_calls") or ()]
    assert not pending


# --------------------------------------------------------------------------- queries


@pytest.mark.parametrize("size", [4, 400])
def test_a_turn_takes_a_fixed_number_of_queries(user, chat_model, assert_queries_at_most, size):
    messages = [user_message(f"m{n}") for n in range(size)]
    conversation = conversation_create(
        owner=user, messages=messages, trigger={"messages": 10_000}, keep={"messages": 2}
    )
    with assert_queries_at_most(budget.CHAT_TURN):
        chat_turn(conversation=conversation, message=user_message("Hi"))


def test_a_turn_that_reaches_the_trigger_queues_a_compaction_for_after_it(
    user, chat_model, settings, django_capture_on_commit_callbacks
):
    """4 messages, trigger 6: the message makes 5, below the trigger, so none is due before
    the call; the reply makes 6. With AUTO_COMPACT on, a compaction task is enqueued once the
    pair is stored, and the turn itself calls no summarizer."""
    from tests.test_tasks import DUMMY, queued

    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True}
    settings.TASKS = DUMMY
    conversation = conversation_create(
        owner=user, system="Be brief.", messages=HISTORY[:3], **POLICY
    )
    assert queued() == []

    with django_capture_on_commit_callbacks(execute=True):
        result = chat_turn(conversation=conversation, message=user_message("One more."))

    assert result.compaction is None  # nothing was due before the call
    [task] = queued()
    assert list(task.args) == [str(conversation.pk), "default"]
    assert summary_requests(chat_model) == []
    assert conversation.active_message_count == 6
