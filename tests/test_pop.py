"""Taking back the newest message (``message_pop``) and starting a conversation over
(``conversation_restart``): what the agent framework integrations' pop and clear are made
of. Neither deletes a message a summary covers; seqs stay gapless and the counters exact;
a compaction that read a message taken back meanwhile conflicts instead of archiving the
message stored in its place."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from ctxsum.models import Conversation, Message, Summary, ToolCall
from ctxsum.policy import Reason
from ctxsum.selectors import context_get
from ctxsum.services import (
    amessage_pop,
    conversation_create,
    conversation_restart,
    conversation_revert,
    message_append,
    message_pop,
)
from tests.factories import (
    assistant_calls,
    compact,
    long_user_message,
    tool_result,
    user_message,
)
from tests.invariants import assert_context_invariants
from tests.postgres import POSTGRES, compact_held, held_openai

pytestmark = pytest.mark.django_db
POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}


def seqs(conversation: Conversation) -> list[int]:
    rows = Message.objects.filter(conversation=conversation).order_by("seq")
    return list(rows.values_list("seq", flat=True))


def test_the_newest_message_is_taken_back_and_its_seq_handed_out_again(user):
    conversation = conversation_create(owner=user, system="Be brief.", messages=[user_message()])
    before = context_get(conversation=Conversation.objects.get(pk=conversation.pk))
    revision = conversation.revision
    message_append(conversation=conversation, messages=[user_message("Oops, wrong one.")])

    popped = message_pop(conversation=conversation)

    assert popped is not None and popped.content == "Oops, wrong one." and popped.seq == 2
    assert not Message.objects.filter(conversation=conversation, seq=2).exists()
    assert conversation.revision == revision + 2  # the caller's instance brought up to date
    after = context_get(conversation=conversation)
    assert after.messages == before.messages
    assert conversation.active_tokens == before.conversation.active_tokens
    assert_context_invariants(conversation)
    appended = message_append(conversation=conversation, messages=[user_message("Right one.")])
    (again,) = appended.messages
    assert again.seq == 2 and seqs(conversation) == [0, 1, 2]


def test_a_tool_call_taken_back_takes_its_index_row_and_may_be_answered_by_no_one(user):
    conversation = conversation_create(owner=user, messages=[user_message(), assistant_calls("c1")])

    popped = message_pop(conversation=conversation)

    assert popped is not None and popped.tool_calls[0]["id"] == "c1"
    assert not ToolCall.objects.filter(conversation=conversation).exists()
    # With its request gone, a result for it answers nothing.
    with pytest.raises(Exception, match="c1"):
        message_append(conversation=conversation, messages=[tool_result("c1")])


def test_a_tool_result_taken_back_leaves_its_call_open_for_another(user):
    history = [user_message(), assistant_calls("c1"), tool_result("c1", "wrong")]
    conversation = conversation_create(owner=user, messages=history)

    assert message_pop(conversation=conversation).tool_call_id == "c1"
    message_append(conversation=conversation, messages=[tool_result("c1", "right")])

    assert context_get(conversation=conversation).messages[-1]["content"] == "right"
    assert_context_invariants(conversation)


def test_the_leading_system_message_and_an_empty_conversation_have_nothing_to_take_back(user):
    empty = conversation_create(owner=user)
    prompt_only = conversation_create(owner=user, system="Be brief.")

    assert message_pop(conversation=empty) is None
    assert message_pop(conversation=prompt_only) is None
    assert seqs(prompt_only) == [0] and prompt_only.revision == 1


def test_a_message_a_summary_covers_is_never_taken_back(user):
    history = [long_user_message(f"u{n}") for n in range(5)]
    conversation = conversation_create(owner=user, system="S.", messages=history, **POLICY)
    compact(conversation)
    conversation_revert(conversation=conversation, version=1)
    # Active again, but the reverted version covered it: it stays.
    covered = Summary.objects.get(conversation=conversation).to_seq
    while conversation.next_seq - 1 > covered:
        assert message_pop(conversation=conversation) is not None
    revision = conversation.revision

    assert message_pop(conversation=conversation) is None
    assert seqs(conversation) == list(range(covered + 1))
    assert conversation.revision == revision


def test_a_deleted_conversation_raises(user):
    conversation = conversation_create(owner=user, messages=[user_message()])
    Conversation.objects.filter(pk=conversation.pk).delete()
    with pytest.raises(Conversation.DoesNotExist):
        message_pop(conversation=conversation)


def test_a_chat_turns_reply_taken_back_takes_its_record_not_its_call_count(
    user, chat_model, settings
):
    from ctxsum.chat.models import ChatCallDay, ChatTurn
    from ctxsum.chat.services import chat_turn

    settings.CTXSUM = {**settings.CTXSUM, "CHAT_MAX_CALLS_PER_USER_PER_DAY": 10}

    conversation = conversation_create(owner=user, system="Be brief.")
    chat_turn(conversation=conversation, message=user_message("Hello"))
    calls = ChatCallDay.objects.get(user=user).calls

    popped = message_pop(conversation=conversation)

    assert popped.role == "assistant"
    assert not ChatTurn.objects.filter(conversation=conversation).exists()
    assert ChatCallDay.objects.get(user=user).calls == calls == 1
    assert seqs(conversation) == [0, 1]


def test_the_async_twin_takes_back_the_same_message(user):
    conversation = conversation_create(owner=user, messages=[user_message(), user_message("b")])
    popped = async_to_sync(amessage_pop)(conversation=conversation)
    assert popped.content == "b" and conversation.next_seq == 1


def test_a_restart_copies_the_settings_and_leaves_the_history_whole(user):
    history = [long_user_message(f"u{n}") for n in range(5)]
    old = conversation_create(
        owner=user,
        title="Trip",
        system="You book flights.",
        metadata={"team": "a"},
        subject="customer-7",
        messages=history,
        **POLICY,
    )
    compact(old)
    before = (seqs(old), list(Summary.objects.filter(conversation=old).values_list("text")))

    new = conversation_restart(conversation=old)

    assert new.pk != old.pk and new.owner == user
    assert (new.title, new.metadata, new.subject) == ("Trip", {"team": "a"}, "customer-7")
    assert (new.trigger, new.keep) == (POLICY["trigger"], POLICY["keep"])
    assert context_get(conversation=new).messages[0] == {
        "role": "system",
        "content": "You book flights.",
    }
    assert seqs(new) == [0]
    assert (seqs(old), list(Summary.objects.filter(conversation=old).values_list("text"))) == before


def test_a_restart_keeps_a_developer_prompt_and_a_replaced_one_is_not_copied(user):
    old = conversation_create(owner=user, messages=[{"role": "developer", "content": "Dev."}])
    assert context_get(conversation=conversation_restart(conversation=old)).messages == [
        {"role": "developer", "content": "Dev."}
    ]
    bare = conversation_restart(conversation=conversation_create(owner=user))
    assert bare.message_count == 0


# A compaction in flight while messages it read are taken back and their seqs reused.


@pytest.fixture
def fake(settings, monkeypatch):
    yield from held_openai(settings, monkeypatch, lease_seconds=30)


def on_postgres(test):
    for mark in reversed(POSTGRES):
        test = mark(test)
    return test


@on_postgres
def test_a_compaction_that_read_a_message_taken_back_meanwhile_conflicts(user, fake):
    history = [long_user_message(f"u{n}") for n in range(6)]
    conversation = conversation_create(owner=user, messages=history, keep={"messages": 1})
    worker = compact_held(conversation, fake, force=True)
    # The call archives seqs 0..4; take back 5 and 4, and store other messages there.
    assert message_pop(conversation=conversation).seq == 5
    assert message_pop(conversation=conversation).seq == 4
    message_append(conversation=conversation, messages=[user_message("new 4"), user_message("5")])

    fake.release()
    outcome = worker.outcome()

    assert outcome.reason == Reason.CONFLICT and not outcome.compacted
    assert not Message.objects.filter(conversation=conversation).archived().exists()
    assert_context_invariants(conversation)
