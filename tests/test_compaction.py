"""Compaction through the service layer: results, incremental versions, reasons, leases,
conflicts and failures leave exactly what they should; the shipped real conversations
compact keeping the invariants."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ctxsum import selectors, services, signals
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import SummarizerError
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import MIN_SUMMARY_BUDGET, Reason
from ctxsum.selectors import prompt_sha256, summary_message
from ctxsum.services import leases
from ctxsum.services.compaction import conversation_compact
from ctxsum.services.leases import lease_seconds
from ctxsum.services.summaries import summary_size
from ctxsum.tokens import context_tokens, count_message
from tests import query_budgets as budget
from tests.backends import HookSummarizer, ReplySummarizer
from tests.factories import (
    OFFLINE_SUMMARIZER,
    assistant_calls,
    assistant_message,
    real_conversations,
    system_message,
    tool_result,
    turns,
    user_message,
)
from tests.invariants import assert_context_invariants

pytestmark = pytest.mark.django_db

TRAVEL = [
    user_message("I need a flight to Delhi."),
    assistant_message("What date?"),
    user_message("October 20."),
    assistant_message("Morning or evening?"),
    user_message("Morning."),
]


def _snapshot(conversation):
    conversation = Conversation.objects.get(pk=conversation.pk)
    return {
        "transcript": [
            (m.seq, m.as_openai(), m.summary_id, m.replaced_at)
            for m in selectors.transcript_list(conversation=conversation)
        ],
        "context": selectors.context_get(conversation=conversation).messages,
        "summaries": list(Summary.objects.filter(conversation=conversation).values()),
        "counters": (
            conversation.next_seq,
            conversation.message_count,
            conversation.active_message_count,
            conversation.active_tokens,
            conversation.revision,
            conversation.updated_at,
        ),
    }


@pytest.fixture
def hook_summarizer(settings):
    settings.CTXSUM = {"SUMMARIZER": "tests.backends.HookSummarizer"}
    HookSummarizer.during = None
    HookSummarizer.calls = []
    return HookSummarizer


TRAVEL_POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}


@pytest.fixture
def travel_policy_user(user, hook_summarizer):
    return user


@pytest.fixture
def travel(user, hook_summarizer):
    return services.conversation_create(
        owner=user, system="You are a travel assistant.", messages=TRAVEL, **TRAVEL_POLICY
    )


def test_travel_example_keeps_system_summary_and_last_two(travel):
    result = conversation_compact(conversation=travel)

    assert result.compacted and result.reason == Reason.COMPACTED
    messages = result.context.messages
    assert messages[0] == system_message("You are a travel assistant.")
    assert messages[1]["role"] == "user"
    assert messages[1]["content"].startswith(ctxsum_settings.SUMMARY_PREFIX)
    assert messages[2:] == [assistant_message("Morning or evening?"), user_message("Morning.")]
    summary = result.summary
    assert (summary.version, summary.from_seq, summary.to_seq) == (1, 1, 3)
    assert summary.prompt_version == ctxsum_settings.PROMPT_VERSION
    assert summary.prompt_sha256 == prompt_sha256(ctxsum_settings.PROMPT)
    assert summary.model == ctxsum_settings.SUMMARY_MODEL
    archived = Message.objects.filter(conversation=travel, summary=summary)
    assert sorted(archived.values_list("seq", flat=True)) == [1, 2, 3]


def test_below_trigger_changes_nothing_and_records_nothing(user):
    conversation = services.conversation_create(
        owner=user, trigger={"messages": 6}, keep={"messages": 2}, messages=TRAVEL
    )
    before = _snapshot(conversation)

    result = conversation_compact(conversation=conversation)

    assert (result.compacted, result.reason) == (False, Reason.BELOW_TRIGGER)
    assert _snapshot(conversation) == before
    assert not CompactionAttempt.objects.filter(conversation=conversation).exists()


def test_second_compaction_is_incremental(travel, hook_summarizer):
    first = conversation_compact(conversation=travel).summary
    hook_summarizer.calls.clear()
    services.message_append(
        conversation=travel,
        messages=[assistant_message("The 7:05 flight, AI-865."), user_message("Book it.")],
    )
    # 1 system + 1 summary + 4 messages reach the trigger of 6 again.
    second = conversation_compact(conversation=travel)

    assert second.compacted
    summary = second.summary
    assert (summary.version, summary.previous_id) == (2, first.pk)
    assert (summary.from_seq, summary.to_seq) == (1, 5)
    first.refresh_from_db()
    assert first.active is False and not summary.previous.active
    # Written from the previous summary plus only the newly archived messages.
    (history,) = hook_summarizer.calls
    assert history.startswith("<summary-so-far>")
    assert "Morning or evening?" in history and "AI-865" not in history
    assert "I need a flight" not in history
    assert Summary.objects.filter(conversation=travel, active=True).get() == summary
    # The counters lost the archived messages and the old summary, and gained the new one.
    assert_context_invariants(travel)


def test_dry_run_plans_without_writing_or_calling(travel, hook_summarizer):
    before = _snapshot(travel)

    result = conversation_compact(conversation=travel, dry_run=True)

    assert (result.compacted, result.reason) == (False, Reason.DRY_RUN)
    assert [row.seq for row in result.archived] == [1, 2, 3]
    # The estimate counts a summary of the budgeted size (the smallest budget here).
    plan = result.plan
    assert plan.summary_budget == MIN_SUMMARY_BUDGET
    kept = result.context.tokens[0:1] + result.context.tokens[4:]
    overhead = count_message(summary_message(""))
    assert plan.tokens_after == context_tokens([*kept, MIN_SUMMARY_BUDGET + overhead])
    assert hook_summarizer.calls == []
    assert _snapshot(travel) == before


def test_nothing_to_summarize_when_forced_on_a_short_conversation(user):
    conversation = services.conversation_create(
        owner=user, system="Sys", keep={"messages": 2}, messages=TRAVEL[:2]
    )

    result = conversation_compact(conversation=conversation, force=True)

    assert result.reason == Reason.NOTHING_TO_SUMMARIZE
    attempt = CompactionAttempt.objects.get(conversation=conversation)
    assert (attempt.outcome, attempt.reason) == ("skipped", "nothing_to_summarize")


def test_newest_message_over_the_trigger_compacts_as_far_as_it_can_then_stops(
    user, hook_summarizer
):
    conversation = services.conversation_create(
        owner=user,
        trigger={"tokens": 200},
        keep={"tokens": 150},
        messages=[user_message("alpha " * 60), assistant_message("beta " * 60)],
    )
    # The newest alone is over the trigger.
    services.message_append(conversation=conversation, messages=[user_message("word " * 300)])

    first = conversation_compact(conversation=conversation)

    assert (first.compacted, first.over_trigger) == (True, True)
    assert [row.seq for row in first.archived] == [0, 1]
    assert first.context.messages[1] == user_message("word " * 300)
    assert first.attempt.tokens_after == first.context.token_count > 200
    # No loop: what is left is the newest message, which no compaction may archive.
    before = _snapshot(conversation)
    second = conversation_compact(conversation=conversation)
    assert (second.compacted, second.reason) == (False, Reason.NOTHING_TO_SUMMARIZE)
    assert second.over_trigger
    assert len(hook_summarizer.calls) == 1
    assert _snapshot(conversation) == before


def test_huge_context_compacts_below_its_trigger_keeping_fewer_than_keep(user, hook_summarizer):
    # Keeping 10 of these ~100-token messages would leave ~1,000 tokens: at the trigger.
    conversation = services.conversation_create(
        owner=user, system="You are terse.", trigger={"tokens": 1000}, keep={"messages": 10}
    )
    text = " ".join(["lorem ipsum dolor sit amet consectetur adipiscing elit sed do"] * 10)
    services.message_append(conversation=conversation, messages=turns(130, text))
    before = selectors.context_get(conversation=conversation).token_count
    assert before > 13_000

    first = conversation_compact(conversation=conversation)

    assert first.compacted and not first.over_trigger
    context = first.context
    # Half the trigger is the target: fewer than 10 kept, and the summary fits beside them.
    kept = len(context.messages) - 2
    assert 1 <= kept < 10
    assert context.token_count <= 500
    assert first.attempt.tokens_after == context.token_count
    second = conversation_compact(conversation=conversation)
    assert (second.compacted, second.reason) == (False, Reason.BELOW_TRIGGER)


def test_fresh_lease_answers_in_progress_without_calling(travel, hook_summarizer):
    Conversation.objects.filter(pk=travel.pk).update(
        lease_owner="another-worker", leased_at=timezone.now()
    )

    result = conversation_compact(conversation=travel)

    assert (result.compacted, result.reason) == (False, Reason.IN_PROGRESS)
    assert hook_summarizer.calls == []
    assert not Summary.objects.filter(conversation=travel).exists()


def test_stale_lease_is_taken_over(travel, hook_summarizer):
    stale = timezone.now() - timedelta(seconds=lease_seconds() + 1)
    Conversation.objects.filter(pk=travel.pk).update(lease_owner="crashed", leased_at=stale)

    result = conversation_compact(conversation=travel)

    assert result.compacted
    travel.refresh_from_db()
    assert (travel.lease_owner, travel.leased_at) == ("", None)


def test_append_during_the_llm_call_survives_and_stays_active(travel, hook_summarizer):
    def append_meanwhile():
        services.message_append(conversation=travel, messages=[assistant_message("Window seat?")])

    hook_summarizer.during = append_meanwhile
    result = conversation_compact(conversation=travel)

    assert result.compacted
    assert result.context.messages[-1] == assistant_message("Window seat?")
    late = Message.objects.get(conversation=travel, seq=6)
    assert late.summary_id is None
    travel.refresh_from_db()
    assert travel.active_message_count == 4  # system, two kept, the late one
    assert (
        travel.active_tokens
        == sum(m.token_count for m in Message.objects.filter(conversation=travel).active())
        + result.summary.token_count
    )


def test_lost_race_writes_nothing_and_records_a_conflict(travel, hook_summarizer):
    def another_worker_compacts():
        # The lease went stale and another worker took over and committed first.
        Conversation.objects.filter(pk=travel.pk).update(lease_owner="", leased_at=None)
        conversation_compact(conversation=travel)

    hook_summarizer.during = another_worker_compacts
    result = conversation_compact(conversation=travel)

    assert (result.compacted, result.reason) == (False, Reason.CONFLICT)
    assert Summary.objects.filter(conversation=travel).count() == 1
    outcomes = sorted(
        CompactionAttempt.objects.filter(conversation=travel).values_list("outcome", flat=True)
    )
    assert outcomes == ["compacted", "conflict"]
    assert Message.objects.filter(conversation=travel).count() == 6


def _assert_conflict_wrote_nothing(result, conversation):
    """A conflict: no summary, nothing archived; ``conversation`` is refreshed."""
    assert (result.compacted, result.reason) == (False, Reason.CONFLICT)
    assert not Summary.objects.filter(conversation=conversation).exists()
    assert not Message.objects.filter(conversation=conversation).archived().exists()
    conversation.refresh_from_db()


def test_a_lease_taken_over_during_the_call_is_a_conflict(travel, hook_summarizer):
    def taken_over():
        # The lease looked abandoned; another worker took it over and is summarizing.
        Conversation.objects.filter(pk=travel.pk).update(
            lease_owner="another-worker", leased_at=timezone.now()
        )

    hook_summarizer.during = taken_over
    _assert_conflict_wrote_nothing(conversation_compact(conversation=travel), travel)
    assert travel.lease_owner == "another-worker", "the new holder's lease was released"


def test_a_range_changed_by_another_writer_rolls_the_whole_commit_back(travel, hook_summarizer):
    # A writer outside ctxsum's services takes one message of the range out of the active
    # context during the call: the archive UPDATE then touches fewer rows than the snapshot
    # had, and the summary inserted just before it must go too.
    def foreign_write():
        Message.objects.filter(conversation=travel, seq=2).update(replaced_at=timezone.now())

    hook_summarizer.during = foreign_write
    _assert_conflict_wrote_nothing(conversation_compact(conversation=travel), travel)
    assert (travel.lease_owner, travel.active_message_count) == ("", 6)


def test_a_result_for_a_request_being_archived_is_a_conflict(user, hook_summarizer):
    request = assistant_calls("call_x", name="f")
    conversation = services.conversation_create(
        owner=user,
        trigger={"messages": 6},
        keep={"messages": 2},
        messages=[
            user_message("Look it up, then tell me. " * 5),
            request,
            *[user_message(f"Still waiting ({n}).") for n in range(4)],
        ],
    )
    late = tool_result("call_x", "Found it.")

    def result_arrives():
        # Its request is still active: the append is accepted.
        services.message_append(conversation=conversation, messages=[late])

    hook_summarizer.during = result_arrives
    result = conversation_compact(conversation=conversation)

    assert (result.compacted, result.reason) == (False, Reason.CONFLICT)
    assert [row.seq for row in result.archived] == [0, 1, 2, 3]
    assert not Summary.objects.filter(conversation=conversation).exists()
    # The next compaction sees the result and keeps it with its request.
    again = conversation_compact(conversation=conversation)
    assert again.compacted and [row.seq for row in again.archived] == [0]
    assert again.context.messages[1]["tool_calls"] == request["tool_calls"]


@pytest.fixture
def reply_summarizer(settings):
    settings.CTXSUM = {"SUMMARIZER": "tests.backends.ReplySummarizer"}
    ReplySummarizer.reply = "Delhi."
    return ReplySummarizer


def _text_of_size(conversation, size):
    """A summary text (stripped, as a summarizer's answer is) whose context message is
    exactly ``size`` tokens."""

    def words(count):
        return " ".join(["fact"] * count)

    low, high = 1, size
    while low < high:  # the fewest words whose message reaches ``size``
        middle = (low + high) // 2
        if summary_size(words(middle), conversation) < size:
            low = middle + 1
        else:
            high = middle
    text = words(low)
    assert summary_size(text, conversation) == size, "no text of exactly that size"
    return text


@pytest.mark.parametrize(("margin", "reason"), [(0, Reason.NO_GAIN), (1, Reason.COMPACTED)])
def test_a_summary_is_committed_only_when_smaller_than_what_it_replaces(
    travel, reply_summarizer, margin, reason
):
    assert conversation_compact(conversation=travel).compacted
    booked = [assistant_message("The 7:05 flight, AI-865."), user_message("Book it.")]
    services.message_append(conversation=travel, messages=booked)
    planned = conversation_compact(conversation=travel, dry_run=True)
    # What the new summary replaces: the archived messages and the old summary.
    replaced = sum(row.token_count for row in planned.archived)
    replaced += planned.context.summary.token_count
    reply_summarizer.reply = _text_of_size(travel, replaced - margin)

    result = conversation_compact(conversation=travel)

    assert result.reason == reason
    assert Summary.objects.filter(conversation=travel).count() == 1 + result.compacted


def test_a_no_gain_range_holds_back_only_ranges_from_its_own_start(
    travel, reply_summarizer, monkeypatch
):
    """A worker plans [1, 3]; before it takes the lease, another worker, whose snapshot has
    two more messages, finds [1, 5] no gain. The first then commits [1, 3]. The next range,
    [4, 5], lies inside the no-gain one but was never sent: it must be tried."""
    take = leases.lease_take

    def another_worker_first(conversation, *, db):
        monkeypatch.setattr(leases, "lease_take", take)
        other = Conversation.objects.get(pk=travel.pk)
        booked = [assistant_message("The 7:05 flight, AI-865."), user_message("Book it.")]
        services.message_append(conversation=other, messages=booked)
        reply_summarizer.reply = " ".join(["fact"] * 100)
        lost = conversation_compact(conversation=other)
        assert lost.reason == Reason.NO_GAIN and [r.seq for r in lost.archived] == [1, 2, 3, 4, 5]
        reply_summarizer.reply = "Delhi."
        return take(conversation, db=db)

    monkeypatch.setattr(leases, "lease_take", another_worker_first)
    first = conversation_compact(conversation=travel)
    assert first.compacted and [row.seq for row in first.archived] == [1, 2, 3]

    then = conversation_compact(conversation=travel)

    assert (then.reason, [row.seq for row in then.archived]) == (Reason.COMPACTED, [4, 5])


def test_over_trigger_is_what_the_compacted_context_is_not_the_estimate(user, reply_summarizer):
    conversation = services.conversation_create(
        owner=user, trigger={"tokens": 300}, keep={"messages": 2}
    )
    facts = [user_message(f"fact {index} " * 20) for index in range(10)]
    services.message_append(conversation=conversation, messages=facts)
    planned = conversation_compact(conversation=conversation, dry_run=True)
    assert planned.plan.compacts and not planned.plan.over_trigger
    # A summary far over its budget, though still smaller than the messages it replaces.
    replaced = sum(row.token_count for row in planned.archived)
    reply_summarizer.reply = _text_of_size(conversation, replaced - 1)

    result = conversation_compact(conversation=conversation)

    assert result.compacted
    assert result.context.token_count >= 300
    assert result.over_trigger


@pytest.mark.django_db(transaction=True)
def test_message_append_from_python_auto_compacts(travel_policy_user, settings):
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "sync"}
    conversation = services.conversation_create(
        owner=travel_policy_user, system="You are a travel assistant.", **TRAVEL_POLICY
    )
    appended = [
        services.message_append(conversation=conversation, messages=[message]) for message in TRAVEL
    ]

    # With the system message, the fifth append reaches the trigger and compacts.
    reasons = [a.compaction.reason for a in appended]
    assert reasons == ["below_trigger"] * 4 + ["compacted"]
    assert appended[-1].compaction.summary_version == 1
    assert appended[-1].messages[0].seq == 5
    assert Summary.objects.get(conversation=conversation).to_seq == 3


def test_inside_a_callers_transaction_auto_compaction_waits_for_the_commit(
    travel, settings, django_capture_on_commit_callbacks
):
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "sync"}
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        appended = services.message_append(
            conversation=travel, messages=[assistant_message("Window seat?")]
        )
        # The summarizer call must not run while this transaction holds the row lock.
        assert appended.compaction.reason == Reason.DEFERRED
        assert not Summary.objects.filter(conversation=travel).exists()
    # The append's signal, the compaction, then the compaction's own summary_created.
    assert len(callbacks) == 3
    assert Summary.objects.filter(conversation=travel).count() == 1


def test_failure_changes_nothing_records_and_signals(
    travel, hook_summarizer, django_capture_on_commit_callbacks
):
    def fail():
        raise SummarizerError("the model is down")

    hook_summarizer.during = fail
    before = _snapshot(travel)
    received = []
    signals.compaction_failed.connect(lambda **kw: received.append(kw), weak=False)
    try:
        with (
            django_capture_on_commit_callbacks(execute=True),
            pytest.raises(SummarizerError, match="the model is down"),
        ):
            conversation_compact(conversation=travel)
    finally:
        signals.compaction_failed.receivers.clear()

    assert _snapshot(travel) == before
    attempt = CompactionAttempt.objects.get(conversation=travel)
    assert attempt.outcome == "failed" and "the model is down" in attempt.error
    assert [kw["attempt"] for kw in received] == [attempt]
    travel.refresh_from_db()
    assert travel.lease_owner == ""


def test_summary_created_is_sent_on_commit(travel, django_capture_on_commit_callbacks):
    received = []

    def receiver(**kwargs):
        received.append(kwargs["summary"])

    signals.summary_created.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            result = conversation_compact(conversation=travel)
        assert received == []  # not before the commit
        for callback in callbacks:
            callback()
    finally:
        signals.summary_created.disconnect(receiver)
    assert received == [result.summary]


def test_replaced_system_message_is_never_summarized(travel):
    services.conversation_update(conversation=travel, system="You are a rail assistant.")
    result = conversation_compact(conversation=travel)

    assert result.compacted
    assert result.context.messages[0] == system_message("You are a rail assistant.")
    leading = Message.objects.filter(conversation=travel, role="system")
    assert all(message.summary_id is None for message in leading)


def test_history_over_the_input_budget_is_summarized_in_chunks(user, settings, hook_summarizer):
    settings.CTXSUM = {
        "SUMMARIZER": "tests.backends.HookSummarizer",
        "SUMMARY_INPUT_BUDGET": 1200,
        "SUMMARY_MAX_TOKENS": 100,
    }
    conversation = services.conversation_create(
        owner=user, trigger={"messages": 20}, keep={"messages": 2}
    )
    services.message_append(
        conversation=conversation, messages=turns(30, "fact-{i:03d} " + "detail " * 40)
    )

    result = conversation_compact(conversation=conversation)

    assert result.compacted
    calls = hook_summarizer.calls
    assert len(calls) > 1
    # Each chunk after the first starts from the summary of the ones before it.
    assert all(call.startswith("<summary-so-far>") for call in calls[1:])
    sent = "".join(calls)
    assert all(f"fact-{index:03d}" in sent for index in range(28))
    assert "fact-028" not in sent and "fact-029" not in sent


@pytest.mark.parametrize("size", [10, 400])
def test_compaction_queries_do_not_grow_with_the_archived_range(user, size, assert_queries_at_most):
    conversation = services.conversation_create(
        owner=user, system="Sys", trigger={"messages": 6}, keep={"messages": 2}
    )
    batch = [user_message(f"message {index}") for index in range(size)]
    services.message_append(conversation=conversation, messages=batch)

    with assert_queries_at_most(budget.COMPACTION):
        result = conversation_compact(conversation=conversation)
    assert result.compacted
    assert Message.objects.filter(conversation=conversation).archived().count() == size - 2


@pytest.mark.django_db(transaction=True)
def test_creating_with_messages_auto_compacts_too(travel_policy_user, settings):
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "sync"}
    long_turns = [{**message, "content": f"{message['content']} " * 8} for message in TRAVEL]

    conversation = services.conversation_create(
        owner=travel_policy_user, system="Sys", messages=long_turns, **TRAVEL_POLICY
    )

    assert conversation.active_message_count == 3  # system, the last two
    assert Summary.objects.get(conversation=conversation).to_seq == 3


REAL_CONVERSATIONS = real_conversations()


@pytest.mark.parametrize(
    "record", REAL_CONVERSATIONS, ids=[record["id"][:48] for record in REAL_CONVERSATIONS]
)
def test_real_conversations_compact_keeping_the_invariants(user, settings, record):
    """The shipped real conversations (parallel tool calls, reused call ids, a call never
    answered, plain chats) appended five messages at a time, each append followed by a
    compaction that the offline summarizer writes: every step keeps the invariants, and
    every conversation compacts at least once."""
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}
    conversation = services.conversation_create(
        owner=user, trigger={"messages": 12}, keep={"messages": 4}
    )
    messages = record["messages"]
    reasons = []
    for end in range(5, len(messages) + 5, 5):
        services.message_append(conversation=conversation, messages=messages[end - 5 : end])
        reasons.append(conversation_compact(conversation=conversation).reason)
        assert_context_invariants(conversation, original_messages=messages[:end])
    assert Reason.COMPACTED in reasons, reasons
    assert set(reasons) <= {
        Reason.COMPACTED,
        Reason.BELOW_TRIGGER,
        Reason.NOTHING_TO_SUMMARIZE,
        Reason.NO_GAIN,
    }, reasons
