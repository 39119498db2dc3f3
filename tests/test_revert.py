"""Undoing a compaction (``services.conversation_revert``): the context afterwards is the
context before the reverted compaction, message for message and token for token, plus
whatever was appended since; reverting again walks back one more version; the reverted
versions stay in the history, marked reverted; invariants (a)-(e) hold after every step.
Compacted by the real compaction with the offline summarizer."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from ctxsum import selectors, services
from ctxsum.exceptions import MessagesInvalid
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import context_get
from ctxsum.services.revert import NOT_ACTIVE
from ctxsum.signals import summary_reverted
from tests.factories import (
    assistant_calls,
    booking_history,
    compact,
    long_user_message,
    tool_result,
    weather_history,
)
from tests.invariants import assert_context_invariants

pytestmark = pytest.mark.django_db

SYSTEM = "You plan trips."
POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}


def snapshot(conversation: Conversation) -> tuple[list[dict[str, Any]], int]:
    """The context as it would be sent: its messages and its token count."""
    context = context_get(conversation=conversation)
    return context.messages, context.token_count


def state(conversation: Conversation) -> tuple:
    """Everything a refused revert must leave as it was."""
    row = Conversation.objects.get(pk=conversation.pk)
    return (
        row.revision,
        row.active_message_count,
        row.active_tokens,
        row.lease_owner,
        list(Message.objects.filter(conversation=row).values_list("seq", "summary")),
        list(
            Summary.objects.filter(conversation=row).values_list(
                "version", "active", "reverted", "superseded"
            )
        ),
        CompactionAttempt.objects.filter(conversation=row).count(),
    )


def appended_tokens(conversation: Conversation, count: int) -> int:
    rows = Message.objects.filter(conversation=conversation).order_by("-seq")[:count]
    return sum(row.token_count for row in rows)


@pytest.fixture
def weather(user, offline_summarizer):
    """The weather chat (a question, two parallel tool calls and their results, …) after a
    system prompt, and every message appended to it, in order."""
    history = weather_history()
    conversation = services.conversation_create(
        owner=user, system=SYSTEM, messages=history, **POLICY
    )
    return conversation, [{"role": "system", "content": SYSTEM}, *history]


def test_a_revert_restores_exactly_the_context_before_the_compaction(weather):
    conversation, originals = weather
    before_messages, before_tokens = snapshot(conversation)
    before = Conversation.objects.get(pk=conversation.pk)
    compacted = compact(conversation)
    summary = compacted.summary
    archived = [row.seq for row in compacted.archived]
    assert archived and 2 in archived, "the tool round was not archived"
    later = [long_user_message("after"), {"role": "assistant", "content": "Noted."}]
    services.message_append(conversation=conversation, messages=later)
    revision = conversation.revision

    result = services.conversation_revert(conversation=conversation, version=summary.version)

    assert (result.reverted, result.reason) == (True, Reason.REVERTED)
    assert result.reverted_summary.pk == summary.pk and result.summary is None
    assert [row.seq for row in result.restored] == archived
    messages, tokens = snapshot(conversation)
    assert messages == [*before_messages, *later]  # byte for byte, plus what came since
    assert tokens == before_tokens + appended_tokens(conversation, len(later))
    # The instance passed is up to date: counters and revision followed.
    assert conversation.revision == revision + 1
    assert conversation.active_message_count == before.active_message_count + len(later)
    assert conversation.active_tokens == before.active_tokens + appended_tokens(
        conversation, len(later)
    )
    assert conversation.lease_owner == "" and conversation.leased_at is None
    summary.refresh_from_db()
    assert (summary.active, summary.reverted) == (False, True)  # kept in the history
    assert not Message.objects.filter(summary=summary).exists()
    attempt = CompactionAttempt.objects.filter(conversation=conversation).latest("created_at")
    assert (attempt.outcome, attempt.reason, attempt.summary_id) == (
        "reverted",
        "reverted",
        summary.pk,
    )
    assert (attempt.from_seq, attempt.to_seq) == (archived[0], archived[-1])
    assert attempt.tokens_after == conversation.context_tokens
    assert_context_invariants(conversation, original_messages=[*originals, *later])


def test_reverting_twice_in_a_row_walks_back_two_versions(weather):
    conversation, originals = weather
    before_first = snapshot(conversation)
    first = compact(conversation).summary
    more = [long_user_message(f"more {index}") for index in range(4)]
    services.message_append(conversation=conversation, messages=more)
    before_second = snapshot(conversation)
    second = compact(conversation).summary
    assert (first.version, second.version) == (1, 2)
    assert_context_invariants(conversation, original_messages=[*originals, *more])

    one = services.conversation_revert(conversation=conversation, version=2)
    assert one.reverted and one.summary.pk == first.pk
    assert snapshot(conversation) == before_second
    assert_context_invariants(conversation, original_messages=[*originals, *more])

    two = services.conversation_revert(conversation=conversation, version=1)
    assert two.reverted and two.summary is None
    messages, tokens = snapshot(conversation)
    assert messages == [*before_first[0], *more]
    assert tokens == before_first[1] + appended_tokens(conversation, len(more))
    assert list(
        Summary.objects.filter(conversation=conversation)
        .order_by("version")
        .values_list("version", "active", "reverted")
    ) == [(1, False, True), (2, False, True)]
    assert not Message.objects.filter(conversation=conversation).archived().exists()
    assert_context_invariants(conversation, original_messages=[*originals, *more])


def test_a_compaction_after_a_revert_extends_the_restored_version(weather):
    conversation, originals = weather
    first = compact(conversation).summary
    more = [long_user_message(f"more {index}") for index in range(4)]
    services.message_append(conversation=conversation, messages=more)
    compact(conversation)
    services.conversation_revert(conversation=conversation, version=2)
    before = snapshot(conversation)

    third = compact(conversation).summary

    # The next free number, written from v1: v2 stays in the history, reverted.
    assert (third.version, third.previous_id, third.from_seq) == (3, first.pk, first.from_seq)
    assert_context_invariants(conversation, original_messages=[*originals, *more])
    services.conversation_revert(conversation=conversation, version=3)
    assert snapshot(conversation) == before
    assert_context_invariants(conversation, original_messages=[*originals, *more])
    services.conversation_revert(conversation=conversation, version=1)
    assert_context_invariants(conversation, original_messages=[*originals, *more])
    assert Summary.objects.filter(conversation=conversation, reverted=True).count() == 3


def test_reverting_a_rebuild_restores_the_version_it_superseded(user, offline_summarizer, settings):
    history = booking_history()
    conversation = services.conversation_create(
        owner=user, system="You book flights.", messages=history, **POLICY
    )
    originals = [{"role": "system", "content": "You book flights."}, *history]
    before_compaction = snapshot(conversation)
    compacted = compact(conversation).summary
    before_rebuild = snapshot(conversation)
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    rebuilt = services.conversation_rebuild(conversation=conversation).summary
    compacted.refresh_from_db()
    assert compacted.superseded

    result = services.conversation_revert(conversation=conversation, version=rebuilt.version)

    assert result.reverted and result.summary.pk == compacted.pk
    assert result.restored == []  # a rebuild archives no message
    compacted.refresh_from_db()
    assert (compacted.active, compacted.superseded) == (True, False)
    assert snapshot(conversation) == before_rebuild
    assert_context_invariants(conversation, original_messages=originals)
    # Stale again (written under version 1 of the prompt): the list says so.
    assert list(selectors.stale_summaries()) == [compacted]

    services.conversation_revert(conversation=conversation, version=compacted.version)
    assert snapshot(conversation) == before_compaction
    assert_context_invariants(conversation, original_messages=originals)


def test_a_call_archived_without_its_result_takes_results_again_once_reverted(
    user, offline_summarizer
):
    history = [
        long_user_message("u0"),
        assistant_calls("call_x"),
        long_user_message("u2"),
        long_user_message("u3"),
        long_user_message("u4"),
    ]
    conversation = services.conversation_create(owner=user, messages=history, **POLICY)
    version = compact(conversation).summary.version
    late = tool_result("call_x", "found it")
    with pytest.raises(MessagesInvalid):
        services.message_append(conversation=conversation, messages=[late])

    services.conversation_revert(conversation=conversation, version=version)

    # Its request is in the context again, so its result may join it.
    services.message_append(conversation=conversation, messages=[late])
    assert_context_invariants(conversation, original_messages=[*history, late])


def test_a_redacted_archived_message_comes_back_redacted_and_recounted(user, offline_summarizer):
    conversation = services.conversation_create(
        owner=user, system="You book flights.", messages=booking_history(), **POLICY
    )
    version = compact(conversation).summary.version
    services.message_redact(conversation=conversation, seq=4)

    services.conversation_revert(conversation=conversation, version=version)

    redacted = Message.objects.get(conversation=conversation, seq=4)
    assert redacted.summary_id is None and redacted.redacted_at is not None
    assert_context_invariants(conversation)  # active_tokens counts it as it is now


def test_only_the_active_summary_can_be_reverted(weather):
    conversation, _ = weather
    compact(conversation)
    services.message_append(
        conversation=conversation, messages=[long_user_message(f"m{i}") for i in range(4)]
    )
    compact(conversation)
    before = state(conversation)

    with pytest.raises(ValidationError) as refused:
        services.conversation_revert(conversation=conversation, version=1)
    assert refused.value.message_dict == {"version": [NOT_ACTIVE.format(version=1, active=2)]}
    with pytest.raises(Summary.DoesNotExist):
        services.conversation_revert(conversation=conversation, version=3)
    assert state(conversation) == before

    services.conversation_revert(conversation=conversation, version=2)
    with pytest.raises(ValidationError) as again:
        services.conversation_revert(conversation=conversation, version=2)  # reverted already
    assert list(again.value.message_dict) == ["version"]


def test_a_conversation_without_a_summary_has_nothing_to_revert(weather):
    conversation, _ = weather
    before = state(conversation)
    with pytest.raises(Summary.DoesNotExist):
        services.conversation_revert(conversation=conversation, version=1)
    compact(conversation)
    services.conversation_revert(conversation=conversation, version=1)
    with pytest.raises(ValidationError) as refused:
        services.conversation_revert(conversation=conversation, version=1)
    assert "has none to revert" in refused.value.message_dict["version"][0]
    assert state(conversation)[4] == before[4]  # every message is active, as at first


def test_a_revert_while_another_worker_holds_the_lease_is_in_progress(weather):
    conversation, _ = weather
    version = compact(conversation).summary.version
    Conversation.objects.filter(pk=conversation.pk).update(lease_owner="another-worker")
    before = state(conversation)

    result = services.conversation_revert(conversation=conversation, version=version)

    assert (result.reverted, result.reason, result.summary) == (False, Reason.IN_PROGRESS, None)
    assert state(conversation) == before


def test_a_compaction_committed_before_the_revert_takes_the_lease_is_a_conflict(
    weather, monkeypatch
):
    """The revert read v1 as active; a compaction commits (and gives its lease back) before
    the revert's lease: the commit finds v2 active and writes nothing."""
    conversation, originals = weather
    compact(conversation)
    more = [long_user_message(f"m{i}") for i in range(4)]
    services.message_append(conversation=conversation, messages=more)
    from ctxsum.services import leases

    real_take = leases.lease_take

    def compaction_first(target: Conversation, *, db: str) -> str | None:
        monkeypatch.setattr(leases, "lease_take", real_take)  # the compaction takes its own
        compact(Conversation.objects.get(pk=target.pk))
        return real_take(target, db=db)

    monkeypatch.setattr(leases, "lease_take", compaction_first)
    result = services.conversation_revert(conversation=conversation, version=1)
    monkeypatch.undo()

    assert (result.reverted, result.reason) == (False, Reason.CONFLICT)
    row = Conversation.objects.get(pk=conversation.pk)
    assert row.lease_owner == ""
    assert list(
        Summary.objects.filter(conversation=conversation)
        .order_by("version")
        .values_list("version", "active", "reverted")
    ) == [(1, False, False), (2, True, False)]
    assert not CompactionAttempt.objects.filter(conversation=conversation, reason="reverted")
    assert_context_invariants(conversation, original_messages=[*originals, *more])


def test_the_signal_goes_out_after_the_commit(weather, django_capture_on_commit_callbacks):
    conversation, _ = weather
    summary = compact(conversation).summary
    received: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        received.append(kwargs)

    summary_reverted.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            result = services.conversation_revert(conversation=conversation, version=1)
    finally:
        summary_reverted.disconnect(receiver)
    (sent,) = received
    assert sent["summary"].pk == summary.pk and sent["restored"] is None
    assert sent["attempt"].pk == result.attempt.pk
    assert sent["conversation"].pk == conversation.pk


def test_a_deleted_conversation_is_does_not_exist(weather):
    conversation, _ = weather
    compact(conversation)
    services.conversation_delete(conversation=Conversation.objects.get(pk=conversation.pk))
    with pytest.raises(Conversation.DoesNotExist):
        services.conversation_revert(conversation=conversation, version=1)
