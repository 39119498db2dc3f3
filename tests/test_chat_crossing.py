"""A chat turn whose message crosses the trigger compacts once: its compaction counts the
message and the reply to come, so the model is sent less than the trigger and the stored
pair leaves no compaction to follow it. Through the real openai client against the fake
server, with AUTO_COMPACT on and the tasks runner (its tasks held by the dummy backend)."""

from __future__ import annotations

from typing import Any

import pytest

from ctxsum.chat.services import chat_turn
from ctxsum.models import Conversation
from ctxsum.selectors import context_get
from ctxsum.services import conversation_compact, conversation_create, conversation_update
from ctxsum.tokens import context_tokens, count_message
from tests.factories import FILLER, assistant_message, long_user_message, user_message
from tests.test_chat import chat_requests, summary_requests

pytestmark = [pytest.mark.django_db, pytest.mark.ctxsum_defaults]


@pytest.fixture
def queued(chat_model, settings):
    """AUTO_COMPACT on, the tasks runner on the dummy backend: what it holds, a callable."""
    from tests.test_tasks import DUMMY, queued

    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True}
    settings.TASKS = DUMMY
    assert queued() == []
    return queued


def long_reply(tag: str) -> dict[str, Any]:
    return assistant_message(f"{tag}: booked for the traveller who {FILLER}")


def sent_tokens(messages: list[dict[str, Any]]) -> int:
    return context_tokens(count_message(message, model="gpt-4o") for message in messages)


def history() -> list[dict[str, Any]]:
    """Four short messages, then six long ones that a keep of six holds verbatim."""
    short = [user_message(f"short {n}: hello there, a few words.") for n in range(4)]
    tail = [long_user_message(f"u{n}") if n % 2 == 0 else long_reply(f"a{n}") for n in range(6)]
    return [*short, *tail]


def just_under(user, room: int) -> Conversation:
    """A conversation whose stored context is ``room`` tokens under its trigger, most of it
    in the kept tail."""
    conversation = conversation_create(
        owner=user,
        system="Be brief.",
        messages=history(),
        trigger={"tokens": 100_000},
        keep={"messages": 6},
    )
    stored = context_get(conversation=conversation).token_count
    return conversation_update(conversation=conversation, trigger={"tokens": stored + room})


def test_a_turn_crossing_the_trigger_compacts_once_and_sends_less_than_it(
    user, chat_model, queued, django_capture_on_commit_callbacks
):
    conversation = just_under(user, room=10)
    trigger = conversation.trigger["tokens"]
    message = long_user_message("u6")
    # The fake's own short summary, then a reply as long as the stored ones.
    chat_model.script = [{}, {"reply": long_reply("a7")["content"]}]

    with django_capture_on_commit_callbacks(execute=True):
        result = chat_turn(conversation=conversation, message=message)

    assert len(summary_requests(chat_model)) == 1
    assert result.compaction is not None and result.compaction.compacted
    assert not result.compaction.over_trigger
    (sent,) = chat_requests(chat_model)
    assert sent["messages"][-1] == message
    assert sent_tokens(sent["messages"]) < trigger
    # The stored pair leaves the context below the trigger: no compaction is queued.
    assert queued() == []
    assert context_get(conversation=conversation).token_count < trigger


def test_the_reply_counts_as_a_message_against_a_message_trigger(
    user, chat_model, queued, django_capture_on_commit_callbacks
):
    """System message and four: the message makes six, the trigger. Keeping two would send
    five, and the reply would make six again; the turn keeps one."""
    conversation = conversation_create(
        owner=user,
        system="Be brief.",
        messages=[long_user_message(f"u{n}") for n in range(4)],
        trigger={"messages": 6},
        keep={"messages": 2},
    )

    with django_capture_on_commit_callbacks(execute=True):
        chat_turn(conversation=conversation, message=long_user_message("u4"))

    assert len(summary_requests(chat_model)) == 1
    (sent,) = chat_requests(chat_model)
    assert [m["content"][:3] for m in sent["messages"][2:]] == ["u3:", "u4:"]
    assert queued() == []
    assert len(context_get(conversation=conversation).messages) == 5


def test_the_reply_counts_as_long_as_the_newest_one_stored(
    user, chat_model, queued, django_capture_on_commit_callbacks
):
    """Keeping all of keep would send less than the trigger, but the reply would cross it:
    the turn keeps fewer, so the stored pair stays below the trigger too."""
    conversation = just_under(user, room=1)
    plan = conversation_compact(conversation=conversation, force=True, dry_run=True).plan
    assert plan is not None and plan.kept == 6
    message, reply = long_user_message("u6"), long_reply("a7")
    message_tokens = count_message(message, model="gpt-4o")
    # A summary a little shorter than the plan's estimate of it.
    summary = "word " * (plan.summary_budget - 5)
    # Keeping six sends less than the trigger; the reply would then reach it.
    trigger = plan.tokens_after + message_tokens + 1
    assert trigger <= context_get(conversation=conversation).token_count + message_tokens
    conversation_update(conversation=conversation, trigger={"tokens": trigger})
    chat_model.script = [{"reply": summary}, {"reply": reply["content"]}]

    with django_capture_on_commit_callbacks(execute=True):
        result = chat_turn(conversation=conversation, message=message)

    assert len(summary_requests(chat_model)) == 1
    assert result.compaction is not None and result.compaction.compacted
    (sent,) = chat_requests(chat_model)
    assert sent_tokens(sent["messages"]) < trigger
    assert queued() == []
    assert context_get(conversation=conversation).token_count < trigger


def test_a_compaction_landing_during_the_model_call_keeps_the_reply(user, chat_model, monkeypatch):
    """The background compaction of the turn before lands while the model answers: the
    reply is stored after the new summary's context, not refused as a redaction."""
    import ctxsum.chat.services as chat

    conversation = conversation_create(
        owner=user,
        system="Be brief.",
        messages=[long_user_message(f"u{n}") for n in range(8)],
        trigger={"messages": 100},
        keep={"messages": 2},
    )
    real_call = chat.call_model

    def compact_then_call(*args: Any, **kwargs: Any) -> Any:
        landed = conversation_compact(
            conversation=Conversation.objects.get(pk=conversation.pk), force=True
        )
        assert landed.compacted
        return real_call(*args, **kwargs)

    monkeypatch.setattr(chat, "call_model", compact_then_call)
    chat_model.script = [{}, {"reply": "Noted."}]

    result = chat_turn(conversation=conversation, message=user_message("and the hotel?"))

    assert [row.content for row in result.messages] == ["and the hotel?", "Noted."]
    context = context_get(conversation=conversation)
    assert context.summary is not None and context.messages[-1]["content"] == "Noted."
