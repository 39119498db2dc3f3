"""Erasure as an invariant (docs/architecture.md, invariant f): from the moment a redaction
commits, no context read, no current summary, no fact and no summarizer input holds the
redacted text, whatever compaction or rebuild was in flight.

The races are played inside the summarizer's call, the moment another worker could act in
production (no lock is held then): the offline summarizer, which copies card numbers into
its summaries, runs a redaction before it answers. That is deterministic on every database;
tests/test_erasure_races.py plays the same races with threads on PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxsum.chat.models import ChatState
from ctxsum.facts.models import Fact, FactChange
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import context_get, current_prompt, summary_withheld
from ctxsum.services import (
    conversation_compact,
    conversation_create,
    conversation_rebuild,
    conversation_revert,
    conversation_update,
    message_append,
    message_redact,
)
from ctxsum.services.autocompact import conversation_compact_queued
from ctxsum.services.leases import lease_expires, lease_release, lease_take
from ctxsum.services.redaction import WITHHELD
from tests.backends import OfflineHookSummarizer
from tests.factories import CARD, booked_conversation, booking_history, turns
from tests.invariants import assert_context_invariants
from tests.settings import TASKS_MODULE
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db
DIGITS = "4111-1111-1111-1111"  # the card number of message 4 (after the system prompt)
CARD_SEQ = 4


@pytest.fixture
def hooked(settings):
    settings.CTXSUM = {"SUMMARIZER": "tests.backends.OfflineHookSummarizer"}
    OfflineHookSummarizer.during = None
    OfflineHookSummarizer.histories = []
    yield OfflineHookSummarizer
    OfflineHookSummarizer.during = None


def redact_card(conversation: Conversation) -> None:
    message_redact(conversation=Conversation.objects.get(pk=conversation.pk), seq=CARD_SEQ)


def fresh(conversation: Conversation) -> Conversation:
    return Conversation.objects.get(pk=conversation.pk)


def assert_erased(conversation: Conversation, secret: str = DIGITS) -> None:
    """The secret is in no context, current summary or fact; the invariants hold."""
    conversation = fresh(conversation)
    assert secret not in json.dumps(context_get(conversation=conversation).messages)
    current = Summary.objects.filter(conversation=conversation, active=True).exclude(
        pk__in=Summary.objects.stale(**current_prompt())
    )
    assert not current.filter(text__contains=secret).exists()
    assert not Summary.objects.filter(conversation=conversation, text__contains=secret).exists()
    assert not Fact.objects.filter(value__contains=secret).exists()
    assert not FactChange.objects.filter(old_value__contains=secret).exists()
    assert_context_invariants(conversation)


def booked_and_grown(user: Any) -> Conversation:
    """The booking compacted once (v1 holds the card), then four more messages."""
    conversation = booked_conversation(user)
    assert DIGITS in Summary.objects.get(conversation=conversation, active=True).text
    message_append(conversation=conversation, messages=turns(4, "more {i}"))
    return fresh(conversation)


def test_redacting_a_summarized_message_withholds_every_version_at_once(user, hooked):
    conversation = booked_and_grown(user)
    before = context_get(conversation=conversation).token_count

    redact_card(conversation)

    summary = Summary.objects.get(conversation=conversation, active=True)
    assert (summary.text, summary.covers_redacted, summary.coverage_facts) == (WITHHELD, True, None)
    assert summary in Summary.objects.stale(**current_prompt())
    context = context_get(conversation=conversation)
    assert context.messages[1]["content"].endswith(WITHHELD)
    assert context.token_count < before  # the notice is shorter than the summary was
    assert_erased(conversation)


def test_the_next_compaction_does_not_carry_a_withheld_summary_forward(user, hooked):
    conversation = booked_and_grown(user)
    redact_card(conversation)
    hooked.histories = []

    result = conversation_compact(conversation=fresh(conversation), force=True)

    assert result.compacted
    summary = result.summary
    assert summary is not None and not summary.covers_redacted
    assert summary.from_seq <= CARD_SEQ <= summary.to_seq
    assert summary not in Summary.objects.stale(**current_prompt())
    # Written anew from every archived message as redacted, not from the notice.
    (history,) = hooked.histories
    assert "<summary-so-far>" not in history and "[redacted]" in history
    assert "Ana" in history and DIGITS not in history
    assert_erased(conversation)


def test_a_redaction_during_the_compaction_call_makes_it_a_conflict(user, hooked):
    conversation = conversation_create(
        owner=user, system="You book flights.", messages=booking_history(), keep={"messages": 2}
    )
    hooked.during = lambda: redact_card(conversation)

    result = conversation_compact(conversation=fresh(conversation), force=True)

    assert (result.compacted, result.reason) == (False, Reason.CONFLICT)
    assert not Summary.objects.filter(conversation=conversation).exists()
    assert Message.objects.get(conversation=conversation, seq=CARD_SEQ).summary_id is None
    assert_erased(conversation)
    # The next compaction reads the redacted message.
    again = conversation_compact(conversation=fresh(conversation), force=True)
    assert again.compacted and DIGITS not in again.summary.text
    assert_erased(conversation)


def test_a_redaction_of_what_the_old_summary_covers_during_the_call_is_a_conflict(user, hooked):
    conversation = booked_and_grown(user)
    hooked.during = lambda: redact_card(conversation)

    result = conversation_compact(conversation=fresh(conversation), force=True)

    assert (result.compacted, result.reason) == (False, Reason.CONFLICT)
    assert list(
        Summary.objects.filter(conversation=conversation).values_list("version", "text")
    ) == [(1, WITHHELD)]
    assert_erased(conversation)


def test_a_second_redaction_during_a_compaction_from_the_archive_is_a_conflict(user, hooked):
    conversation = booked_and_grown(user)
    redact_card(conversation)
    name_seq = 1  # "Book AI-101 for Ana.", archived under the withheld v1
    hooked.during = lambda: message_redact(conversation=fresh(conversation), seq=name_seq)

    result = conversation_compact(conversation=fresh(conversation), force=True)

    assert (result.compacted, result.reason) == (False, Reason.CONFLICT)
    assert_erased(conversation, secret="Book AI-101 for Ana")
    again = conversation_compact(conversation=fresh(conversation), force=True)
    assert again.compacted and "Book AI-101 for Ana" not in again.summary.text
    assert_erased(conversation)


def test_a_redaction_during_a_rebuild_makes_it_a_conflict(user, hooked, settings):
    conversation = booked_conversation(user)
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    hooked.during = lambda: redact_card(conversation)

    result = conversation_rebuild(conversation=fresh(conversation))

    assert (result.rebuilt, result.reason) == (False, Reason.CONFLICT)
    assert fresh(conversation).lease_owner == ""
    assert_erased(conversation)
    rebuilt = conversation_rebuild(conversation=fresh(conversation))
    assert rebuilt.rebuilt and DIGITS not in rebuilt.summary.text
    assert not rebuilt.summary.covers_redacted
    assert_erased(conversation)


def test_a_rebuild_of_a_withheld_summary_gets_a_summary_sized_budget(user, hooked):
    conversation = booked_conversation(user)
    redact_card(conversation)

    rebuilt = conversation_rebuild(conversation=fresh(conversation))

    assert rebuilt.rebuilt
    assert "Ana" in rebuilt.summary.text and "AI-101" in rebuilt.summary.text
    assert rebuilt.summary.token_count > rebuilt.replaced.token_count
    assert_erased(conversation)


def test_a_large_message_redacted_during_the_call_leaves_exact_counters(user, hooked, api):
    big = " ".join(f"{DIGITS} is card {index}." for index in range(300))
    conversation = conversation_create(
        owner=user,
        system="You book flights.",
        messages=[*booking_history()[:3], {"role": "assistant", "content": big}, *turns(4)],
        keep={"messages": 2},
    )
    assert Message.objects.get(conversation=conversation, seq=CARD_SEQ).token_count > 3000
    hooked.during = lambda: redact_card(conversation)

    response = api.post(api_url("compact", conversation), {"force": True}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["reason"] == "conflict"
    row = fresh(conversation)
    assert row.active_tokens > 0
    assert_erased(conversation)  # the counters equal the row sums


def test_the_rebuild_shares_the_compactions_no_gain_guard(user, hooked, settings):
    conversation = booked_conversation(user)
    archived = Message.objects.filter(conversation=conversation).archived()
    stands_for = sum(archived.values_list("token_count", flat=True))
    settings.CTXSUM = {
        "SUMMARIZER": "tests.backends.ReplySummarizer",
        "PROMPT_VERSION": "2",
    }
    from tests.backends import ReplySummarizer

    ReplySummarizer.reply = " ".join(["word"] * (stands_for + 50))
    active = Summary.objects.get(conversation=conversation, active=True)

    result = conversation_rebuild(conversation=fresh(conversation))

    assert (result.rebuilt, result.reason) == (False, Reason.NO_GAIN)
    assert Summary.objects.get(conversation=conversation, active=True) == active
    attempt = CompactionAttempt.objects.filter(conversation=conversation).latest("pk")
    assert (attempt.outcome, attempt.reason) == ("skipped", "no_gain")
    assert fresh(conversation).lease_owner == ""
    ReplySummarizer.reply = "A summary."


def test_the_withheld_notice_never_grows_the_context(user, settings):
    settings.CTXSUM = {"SUMMARIZER": "tests.backends.ReplySummarizer"}
    from tests.backends import ReplySummarizer

    ReplySummarizer.reply = "Ok."
    conversation = conversation_create(
        owner=user, system="You book flights.", messages=booking_history(), keep={"messages": 2}
    )
    assert conversation_compact(conversation=conversation, force=True).compacted
    before = context_get(conversation=fresh(conversation)).token_count

    redact_card(conversation)

    summary = Summary.objects.get(conversation=conversation, active=True)
    assert summary.text != "Ok." and summary.covers_redacted
    assert context_get(conversation=fresh(conversation)).token_count <= before
    assert_context_invariants(fresh(conversation))


def test_with_the_sync_runner_the_redaction_rebuilds_after_its_commit(
    user, hooked, settings, django_capture_on_commit_callbacks
):
    conversation = booked_conversation(user)
    settings.CTXSUM = {**settings.CTXSUM, "COMPACTION_RUNNER": "sync"}

    with django_capture_on_commit_callbacks(execute=True):
        redact_card(conversation)

    summary = Summary.objects.get(conversation=conversation, active=True)
    assert (summary.origin, summary.covers_redacted, summary.version) == ("rebuild", False, 2)
    assert "Ana" in summary.text
    assert_erased(conversation)


def test_the_card_is_in_the_facts_before_and_nowhere_after(user, hooked):
    conversation = booked_conversation(user)
    assert any(CARD.split()[-1] in fact.value for fact in Fact.objects.all()) or DIGITS in (
        Summary.objects.get(conversation=conversation).text
    )

    redact_card(conversation)

    assert_erased(conversation)


def test_the_task_runner_rebuilds_a_withheld_summary_by_itself(
    user, hooked, settings, django_capture_on_commit_callbacks
):
    conversation = booked_conversation(user)
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "tasks"}
    settings.TASKS = {"default": {"BACKEND": f"{TASKS_MODULE}.backends.immediate.ImmediateBackend"}}

    with django_capture_on_commit_callbacks(execute=True):
        redact_card(conversation)

    summary = Summary.objects.get(conversation=conversation, active=True)
    assert (summary.origin, summary.covers_redacted, summary.version) == ("rebuild", False, 2)
    assert not summary_withheld(conversation=conversation)
    assert_erased(conversation)


def test_a_task_finding_the_lease_held_runs_again_when_it_expires(user, hooked):
    conversation = booked_conversation(user)
    redact_card(conversation)
    token = lease_take(fresh(conversation), db="default")
    deferred: list[Any] = []

    def defer(conversation_id: str, database: str, run_after: Any, since: Any) -> None:
        deferred.append(run_after)

    held = conversation_compact_queued(
        conversation_id=str(conversation.pk), database="default", defer=defer
    )

    assert held.reason == Reason.IN_PROGRESS
    assert deferred == [lease_expires(fresh(conversation))]
    assert summary_withheld(conversation=conversation)
    lease_release(conversation, token, db="default")
    done = conversation_compact_queued(conversation_id=str(conversation.pk), database="default")
    assert (done.compacted, done.reason) == (True, Reason.REBUILT)
    assert not summary_withheld(conversation=conversation)
    assert_erased(conversation)


def test_below_its_trigger_a_conversation_without_a_withheld_summary_is_left_alone(user, hooked):
    conversation = booked_conversation(user)

    result = conversation_compact_queued(conversation_id=str(conversation.pk), database="default")

    assert result.reason == Reason.BELOW_TRIGGER
    assert Summary.objects.filter(conversation=conversation).count() == 1


def test_a_stale_instance_redacts_by_the_rows_subject(user, hooked):
    """The caller's instance predates the subject: the redaction plans from the row, locks
    the subject's conversations and takes the card back from the subject's facts."""
    conversation = conversation_create(
        owner=user,
        system="You book flights.",
        messages=booking_history(),
        trigger={"messages": 6},
        keep={"messages": 2},
    )
    stale = fresh(conversation)
    conversation_update(conversation=fresh(conversation), subject="ana")
    compacted = conversation_compact(conversation=fresh(conversation), force=True)
    assert compacted.compacted
    citing = [f for f in Fact.objects.filter(subject="ana") if CARD_SEQ in f.source_seqs]
    assert citing  # the subject's fact taken from the card's message too

    message_redact(conversation=stale, seq=CARD_SEQ)

    assert stale.subject == "ana"  # brought up to date
    assert not [f for f in Fact.objects.all() if CARD_SEQ in f.source_seqs]
    assert_erased(conversation)


def test_a_revert_back_to_a_withheld_version_has_it_rebuilt(
    user, hooked, settings, django_capture_on_commit_callbacks
):
    conversation = booked_and_grown(user)
    redact_card(conversation)
    assert conversation_compact(conversation=fresh(conversation), force=True).compacted
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "sync"}

    with django_capture_on_commit_callbacks(execute=True):
        reverted = conversation_revert(conversation=fresh(conversation), version=2)

    assert reverted.reverted
    summary = Summary.objects.get(conversation=conversation, active=True)
    assert (summary.version, summary.origin, summary.covers_redacted) == (3, "rebuild", False)
    assert_erased(conversation)


def test_a_redaction_during_a_revert_of_a_withheld_version_keeps_the_counters(
    user, hooked, monkeypatch
):
    """v2 is already withheld; a redaction of what v1 covers lands after the revert read
    its versions: the revert restores v1 as it is under the lock, not as it was read."""
    from ctxsum.facts import hooks as fact_hooks

    conversation = booked_and_grown(user)
    assert conversation_compact(conversation=fresh(conversation), force=True).compacted
    v1, v2 = Summary.objects.filter(conversation=conversation).order_by("version")
    newer = next(
        row.seq
        for row in Message.objects.filter(conversation=conversation, summary=v2).order_by("seq")
        if row.content
    )
    message_redact(conversation=fresh(conversation), seq=newer)  # v2 withheld, v1 not
    assert not Summary.objects.get(pk=v1.pk).covers_redacted
    real = fact_hooks.facts_to_revert

    def redact_first(target: Summary) -> bool:
        redact_card(conversation)  # in v1's range: v1 withheld now
        return real(target)

    monkeypatch.setattr(fact_hooks, "facts_to_revert", redact_first)

    result = conversation_revert(conversation=fresh(conversation), version=v2.version)

    assert result.reverted and result.summary.covers_redacted
    assert_erased(conversation)  # active_tokens equals the row sums


@pytest.mark.parametrize("stream", [False, True])
def test_a_redaction_during_the_chat_models_call_stores_no_reply(
    api, user, chat_model, monkeypatch, stream
):
    """The model was sent the card; its reply (which may quote it) is not stored once the
    card's message was redacted during the call: 409 context_redacted, nothing stored."""
    import ctxsum.chat.services as chat

    conversation = conversation_create(
        owner=user, system="You book flights.", messages=booking_history()
    )
    chat_model.reply = f"You paid with {DIGITS}."
    real_call, real_stream = chat.call_model, chat.stream_model

    def redact_then(real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            redact_card(conversation)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(chat, "call_model", redact_then(real_call))
    monkeypatch.setattr(chat, "stream_model", redact_then(real_stream))
    count = fresh(conversation).message_count
    body = {"message": {"role": "user", "content": "Which card did I use?"}, "stream": stream}

    response = api.post(api_url("chat", conversation), body, format="json")

    if stream:
        text = b"".join(response.streaming_content).decode()
        assert "event: error" in text and "context_redacted" in text
        assert "event: ctxsum" not in text
    else:
        assert response.status_code == 409, response.content
        assert response.json()["code"] == "context_redacted"
    row = fresh(conversation)
    assert row.message_count == count and ChatState.objects.get(pk=row.pk).turn_owner == ""
    assert_erased(conversation)


def test_a_withheld_summary_whose_rebuild_gave_no_gain_is_not_resent_by_the_task(
    user, hooked, settings
):
    from tests.backends import ReplySummarizer

    conversation = booked_conversation(user)
    redact_card(conversation)
    archived = Message.objects.filter(conversation=conversation).archived()
    ReplySummarizer.reply = " ".join(["word"] * (sum(r.token_count for r in archived) + 50))
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": "tests.backends.ReplySummarizer"}
    no_gain = CompactionAttempt.objects.filter(conversation=conversation, reason="no_gain")
    queued = {"conversation_id": str(conversation.pk), "database": "default"}
    try:
        first = conversation_compact_queued(**queued)
        again = conversation_compact_queued(**queued)
    finally:
        ReplySummarizer.reply = "A summary."

    assert first.reason == Reason.NO_GAIN and no_gain.count() == 1
    assert again.reason != Reason.NO_GAIN and no_gain.count() == 1  # no second call
    assert summary_withheld(conversation=conversation)
    assert_erased(conversation)
