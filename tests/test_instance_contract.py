"""One contract for the instance a service is given: what a service plans from is the row
as it reads it, never the caller's instance (which may be stale), and the dicts it is given
are copied (a caller that changes them afterwards changes nothing stored, nothing on the
instance it got back, nothing a turn sends)."""

from __future__ import annotations

from typing import Any

import pytest

from ctxsum import tokens
from ctxsum.chat.exceptions import ContextTooLong
from ctxsum.chat.models import ChatState, ChatTurn
from ctxsum.chat.services import ChatResult, chat_turn
from ctxsum.models import Conversation, Message
from ctxsum.selectors import conversation_policy
from ctxsum.services import conversation_create, conversation_update
from tests.factories import long_user_message, user_message

pytestmark = pytest.mark.django_db

HISTORY = [long_user_message(f"u{n}") for n in range(4)]
# Far more tokens under gpt-4's encoding (cl100k) than under gpt-4o's (o200k): 19 against 12.
JAPANESE = "こんにちは世界、今日はいい天気ですね"


def chat_bodies(server: Any) -> list[dict[str, Any]]:
    return [body for body in server.bodies if body["model"] != "summary-model-1"]


def summary_bodies(server: Any) -> list[dict[str, Any]]:
    return [body for body in server.bodies if body["model"] == "summary-model-1"]


def stale_copy(conversation: Conversation, **changes: Any) -> Conversation:
    """``conversation`` stays as it is, stale, while another instance of its row changes."""
    other = Conversation.objects.get(pk=conversation.pk)
    conversation_update(conversation=other, **changes)
    return other


# --------------------------------------------------------------------------- chat_turn


def test_a_stale_instance_compacts_when_the_rows_trigger_says_so(user, chat_model):
    """The instance's trigger (100 messages) says no compaction is due; the row's (6) says
    one is: the turn compacts before its call, as the row requires."""
    stale = conversation_create(
        owner=user,
        system="Be brief.",
        messages=HISTORY,
        trigger={"messages": 100},
        keep={"messages": 2},
    )
    stale_copy(stale, trigger={"messages": 6})
    assert stale.trigger == {"messages": 100}

    result = chat_turn(conversation=stale, message=long_user_message("u4"))

    assert result.compaction is not None and result.compaction.compacted
    assert len(summary_bodies(chat_model)) == 1
    # The model was sent the compacted context: the summary, not the archived messages.
    (body,) = chat_bodies(chat_model)
    assert len(body["messages"]) < 1 + len(HISTORY) + 1
    assert stale.trigger == {"messages": 6}  # the caller's instance, brought up to date
    assert result.conversation is stale


def test_a_stale_instance_does_not_compact_when_the_rows_trigger_is_not_reached(user, chat_model):
    stale = conversation_create(
        owner=user,
        system="Be brief.",
        messages=HISTORY,
        trigger={"messages": 6},
        keep={"messages": 2},
    )
    stale_copy(stale, trigger={"messages": 100})

    result = chat_turn(conversation=stale, message=long_user_message("u4"))

    assert result.compaction is None
    assert summary_bodies(chat_model) == []


def test_a_stale_instance_calls_the_rows_model(user, chat_model):
    stale = conversation_create(owner=user, messages=HISTORY[:1])
    stale_copy(stale, model="gpt-4")
    assert stale.model == ""  # the instance would call DEFAULT_MODEL, gpt-4o

    result = chat_turn(conversation=stale, message=user_message(JAPANESE))

    assert [body["model"] for body in chat_bodies(chat_model)] == ["gpt-4"]
    assert result.turn.requested_model == result.turn.model == "gpt-4"
    # Counted with the row's model's encoding, not the instance's.
    new = Message.objects.get(conversation=stale, seq=1)
    assert new.token_count == tokens.count_message(user_message(JAPANESE), model="gpt-4")
    assert new.token_count != tokens.count_message(user_message(JAPANESE), model="gpt-4o")


def test_a_stale_instance_is_held_to_the_rows_ceiling(user, chat_model):
    """The row's max_context_tokens (120) is below the context even after compaction; the
    stale instance has none: the turn is refused and stores nothing."""
    stale = conversation_create(
        owner=user, messages=HISTORY, trigger={"messages": 100}, keep={"messages": 2}
    )
    stale_copy(stale, max_context_tokens=120)
    messages_before = Message.objects.filter(conversation=stale).count()

    with pytest.raises(ContextTooLong, match=r"max_context_tokens \(120\)"):
        chat_turn(conversation=stale, message=user_message("word " * 200))

    assert chat_bodies(chat_model) == []
    assert Message.objects.filter(conversation=stale).count() == messages_before
    assert not ChatTurn.objects.filter(conversation=stale).exists()
    state = ChatState.objects.get(pk=stale.pk)
    assert state.turn_owner == "" and state.chat_calls == 0


def test_a_model_changed_during_the_call_counts_the_pair_with_the_new_encoding(user, chat_model):
    """The row's model changes while a streamed turn waits for its answer: the pair is
    counted, under the commit's lock, with the encoding the row names then."""
    chat_model.reply = JAPANESE
    conversation = conversation_create(owner=user, messages=HISTORY[:1])
    stream = chat_turn(conversation=conversation, message=user_message(JAPANESE), stream=True)
    stale_copy(conversation, model="gpt-4")

    *_, result = list(stream)

    assert isinstance(result, ChatResult)
    expected = tokens.count_message(user_message(JAPANESE), model="gpt-4")
    assert result.messages[0].token_count == expected
    row = Conversation.objects.get(pk=conversation.pk)
    stored = Message.objects.filter(conversation=row).order_by("seq")
    assert row.active_tokens == sum(m.token_count for m in stored)


def test_the_turns_message_and_tools_are_copied(user, chat_model):
    """A streamed turn calls the model when it is iterated: a caller that changes its
    message or tools before that changes neither what is sent nor what is stored."""
    conversation = conversation_create(owner=user, messages=HISTORY[:1])
    message = {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    stream = chat_turn(conversation=conversation, message=message, tools=tools, stream=True)

    message["content"][0]["text"] = "Changed."
    tools[0]["function"]["name"] = "changed"
    list(stream)

    (body,) = chat_bodies(chat_model)
    assert body["messages"][-1]["content"] == [{"type": "text", "text": "What is 2+2?"}]
    assert body["tools"][0]["function"]["name"] == "add"
    stored = Message.objects.get(conversation=conversation, seq=1)
    assert stored.content == [{"type": "text", "text": "What is 2+2?"}]


# --------------------------------------------------------------------------- conversations


def test_the_dicts_given_to_conversation_create_are_copied(user):
    trigger, keep = {"messages": 6}, {"messages": 2}
    metadata = {"customer": {"tags": ["vip"]}}
    conversation = conversation_create(owner=user, trigger=trigger, keep=keep, metadata=metadata)

    trigger["messages"] = 1
    keep["messages"] = 99
    metadata["customer"]["tags"].append("changed")
    metadata["added"] = True

    row = Conversation.objects.get(pk=conversation.pk)
    for instance in (conversation, row):
        assert instance.trigger == {"messages": 6}
        assert instance.keep == {"messages": 2}
        assert instance.metadata == {"customer": {"tags": ["vip"]}}
    assert conversation_policy(conversation).trigger.messages == 6
    # A later save of the instance writes what was given, not what the caller changed.
    conversation.save()
    assert Conversation.objects.get(pk=conversation.pk).trigger == {"messages": 6}


def test_the_dicts_given_to_conversation_update_are_copied(user):
    conversation = conversation_create(owner=user)
    trigger, keep = {"messages": 8}, {"tokens": 500}
    metadata = {"customer": {"tags": ["vip"]}}

    returned = conversation_update(
        conversation=conversation, trigger=trigger, keep=keep, metadata=metadata
    )
    trigger["messages"] = 1
    keep["tokens"] = 1
    metadata["customer"]["tags"].append("changed")

    row = Conversation.objects.get(pk=conversation.pk)
    for instance in (returned, row):
        assert instance.trigger == {"messages": 8}
        assert instance.keep == {"tokens": 500}
        assert instance.metadata == {"customer": {"tags": ["vip"]}}
    returned.save()
    saved = Conversation.objects.get(pk=conversation.pk)
    assert saved.metadata == {"customer": {"tags": ["vip"]}}
    assert saved.trigger == {"messages": 8}
