"""A blank answer of the chat model ("", whitespace) is a failed attempt: retried and fallen
back like a transient error (CHAT_RETRIES, CHAT_FALLBACK_MODELS), never stored; blank every
time, the turn fails like any model error and stores nothing. Through the real openai
client against the local OpenAI-compatible server, plain and streamed, as a service and
over REST."""

from __future__ import annotations

from typing import Any

import pytest

from ctxsum.chat.exceptions import ModelError
from ctxsum.chat.model_calls import BLANK_REPLY
from ctxsum.chat.models import ChatState, ChatTurn
from ctxsum.chat.services import ChatResult, chat_turn
from ctxsum.models import Conversation, Message
from ctxsum.services import conversation_create
from tests.factories import tool_call, user_message
from tests.support.urls import api_url
from tests.test_chat_api import events

pytestmark = pytest.mark.django_db

BLANKS = ["", "   ", "\n\t  \n"]


@pytest.fixture
def conversation(user) -> Conversation:
    return conversation_create(owner=user, system="Be brief.", messages=[user_message("Hi")])


def chat_models(server: Any) -> list[str]:
    return [body["model"] for body in server.bodies if body["model"] != "summary-model-1"]


def contents(conversation: Conversation) -> list[Any]:
    return list(
        Message.objects.filter(conversation=conversation)
        .order_by("seq")
        .values_list("content", flat=True)
    )


def assert_nothing_stored(conversation: Conversation) -> None:
    row = Conversation.objects.get(pk=conversation.pk)
    assert contents(row) == ["Be brief.", "Hi"]
    assert not ChatTurn.objects.filter(conversation=row).exists()
    state = ChatState.objects.get(pk=row.pk)
    assert state.turn_owner == "" and state.chat_calls == 0  # the reservation was given back


def deltas(chunks: list[Any]) -> str:
    return "".join(
        chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"]
    )


@pytest.mark.parametrize("blank", BLANKS)
def test_a_blank_answer_is_retried_and_only_the_good_one_stored(conversation, chat_model, blank):
    chat_model.script = [{"reply": blank}]
    chat_model.reply = "Good answer."

    result = chat_turn(conversation=conversation, message=user_message("Question?"))

    assert chat_models(chat_model) == ["gpt-4o", "gpt-4o"]
    assert result.messages[-1].content == "Good answer."
    assert contents(conversation) == ["Be brief.", "Hi", "Question?", "Good answer."]
    assert result.turn.attempts == 2 and result.turn.fallbacks == 0


def test_a_streamed_blank_answer_is_retried_and_none_of_its_chunks_passed_on(
    conversation, chat_model
):
    chat_model.script = [{"reply": "   "}]
    chat_model.reply = "Good answer."

    *chunks, result = list(
        chat_turn(conversation=conversation, message=user_message("Question?"), stream=True)
    )

    assert isinstance(result, ChatResult)
    assert chat_models(chat_model) == ["gpt-4o", "gpt-4o"]
    # One answer's chunks: one role chunk, one finish, one usage chunk.
    assert sum(1 for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]) == 1
    assert sum(1 for c in chunks if c.get("usage")) == 1
    assert deltas(chunks) == "Good answer."
    assert contents(conversation)[-1] == "Good answer."
    assert result.turn.attempts == 2


def test_leading_whitespace_of_a_real_answer_is_passed_on_and_stored(conversation, chat_model):
    """Held back only while nothing has been said: the whitespace a real answer starts with
    reaches the client, and the stored reply is what the client put together."""
    chat_model.reply = "   Indented answer."
    chat_model.stream_pieces = 6

    *chunks, result = list(
        chat_turn(conversation=conversation, message=user_message("Question?"), stream=True)
    )

    assert chat_models(chat_model) == ["gpt-4o"]
    assert deltas(chunks) == result.messages[-1].content == "   Indented answer."


def test_a_blank_answer_falls_back_to_the_next_model(conversation, chat_model, settings):
    settings.CTXSUM = {**settings.CTXSUM, "CHAT_RETRIES": 0, "CHAT_FALLBACK_MODELS": ["backup"]}
    chat_model.script = [{"reply": ""}]
    chat_model.reply = "From the backup."

    result = chat_turn(conversation=conversation, message=user_message("Question?"))

    assert chat_models(chat_model) == ["gpt-4o", "backup"]
    assert result.turn.model == "backup" and result.turn.fallbacks == 1
    assert contents(conversation)[-1] == "From the backup."


@pytest.mark.parametrize("stream", [False, True])
def test_blank_every_time_fails_the_turn_and_stores_nothing(conversation, chat_model, stream):
    chat_model.reply = "  "

    message = user_message("Question?")
    with pytest.raises(ModelError, match=BLANK_REPLY):
        result = chat_turn(conversation=conversation, message=message, stream=stream)
        if stream:
            list(result)

    # CHAT_RETRIES (2): three attempts of the one model.
    assert chat_models(chat_model) == ["gpt-4o"] * 3
    assert_nothing_stored(conversation)


def test_a_reply_of_tool_calls_alone_is_not_blank(conversation, chat_model):
    chat_model.tool_calls = [tool_call("call_1", "lookup", '{"q": "x"}')]

    *_, result = list(
        chat_turn(conversation=conversation, message=user_message("Look it up."), stream=True)
    )

    assert chat_models(chat_model) == ["gpt-4o"]
    assert result.messages[-1].tool_calls[0]["id"] == "call_1"


# --------------------------------------------------------------------------- over REST


@pytest.mark.parametrize("stream", [False, True])
def test_over_rest_blank_every_time_is_a_model_error_and_stores_nothing(
    api, conversation, chat_model, stream
):
    chat_model.reply = ""
    body = {"message": user_message("Question?"), "stream": stream}

    response = api.post(api_url("chat", conversation), body, format="json")

    # A failure before the first chunk is an ordinary JSON error, streamed or not.
    assert response.status_code == 502, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "model_error"
    assert_nothing_stored(conversation)


def test_over_rest_a_streamed_blank_then_good_answer_sends_and_stores_the_good_one(
    api, conversation, chat_model
):
    chat_model.script = [{"reply": "\n"}]
    chat_model.reply = "Good answer."
    body = {"message": user_message("Question?"), "stream": True}

    response = api.post(api_url("chat", conversation), body, format="json")

    parsed = events(response)
    assert [name for name, _ in parsed][-2:] == ["ctxsum", None]
    assert parsed[-1][1] == "[DONE]"
    assert all(name != "error" for name, _ in parsed)
    assert contents(conversation)[-1] == "Good answer."
