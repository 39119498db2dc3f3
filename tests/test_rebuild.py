"""Stale summaries and erasure: a summary written under another prompt, or covering a
redacted message, is stale; a rebuild writes it anew from the archived originals under the
current prompt, keeps the old version (superseded), and covers the same range."""

from __future__ import annotations

import pytest

from ctxsum import selectors, services
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.services.redaction import REDACTED
from tests.backends import HookSummarizer
from tests.factories import CARD as SECRET
from tests.factories import booked_conversation, booking_history
from tests.invariants import assert_context_invariants

pytestmark = pytest.mark.django_db

TURNS = booking_history()


@pytest.fixture
def compacted(user, offline_summarizer):
    return booked_conversation(user)


def test_a_compaction_stores_its_coverage_check(compacted):
    summary = Summary.objects.get(conversation=compacted, active=True)
    facts = {fact["text"]: fact["present"] for fact in summary.coverage_facts}
    assert {"AI-101", "Ana"} <= set(facts)
    assert summary.coverage == sum(facts.values()) / len(facts)


def test_a_new_prompt_version_makes_summaries_stale_and_a_rebuild_replaces_them(
    compacted, settings
):
    old = Summary.objects.get(conversation=compacted, active=True)
    assert not selectors.stale_summaries().exists()
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    assert list(selectors.stale_summaries()) == [old]
    assert selectors.summary_is_stale(old)

    result = services.conversation_rebuild(conversation=compacted)

    assert (result.rebuilt, result.reason) == (True, Reason.REBUILT)
    new = result.summary
    assert (new.version, new.origin, new.prompt_version) == (old.version + 1, "rebuild", "2")
    assert (new.from_seq, new.to_seq) == (old.from_seq, old.to_seq)
    old.refresh_from_db()
    assert old.superseded and not old.active  # kept, marked
    assert not selectors.stale_summaries().exists()
    assert compacted.revision == Conversation.objects.get(pk=compacted.pk).revision
    assert_context_invariants(compacted)
    attempt = CompactionAttempt.objects.filter(conversation=compacted).latest("created_at")
    assert (attempt.reason, attempt.summary_id) == ("rebuilt", new.pk)


def test_a_changed_prompt_text_makes_summaries_stale_too(compacted, settings):
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT": "Summarize tersely."}
    assert selectors.stale_summaries().count() == 1


def test_redacting_an_archived_message_erases_it_from_the_rebuilt_summary(compacted):
    old = Summary.objects.get(conversation=compacted, active=True)
    assert SECRET in old.text  # the offline summarizer keeps sentences verbatim
    revision = compacted.revision

    message = services.message_redact(conversation=compacted, seq=4)

    assert (message.seq, message.content) == (4, REDACTED) and message.redacted_at
    assert compacted.revision == revision + 1
    old.refresh_from_db()
    assert old.covers_redacted and selectors.summary_is_stale(old)
    assert list(selectors.stale_summaries()) == [old]
    result = services.conversation_rebuild(conversation=compacted)
    assert result.rebuilt
    assert SECRET not in result.summary.text
    assert all(SECRET not in fact["text"] for fact in result.summary.coverage_facts)
    assert not selectors.stale_summaries().exists()
    assert_context_invariants(compacted)


def test_redacting_an_active_message_recounts_the_context(compacted):
    conversation = compacted
    last = Message.objects.filter(conversation=conversation).order_by("-seq").first()
    tokens_before = conversation.active_tokens
    message = services.message_redact(conversation=conversation, seq=last.seq)
    assert conversation.active_tokens == tokens_before - last.token_count + message.token_count
    context = selectors.context_get(conversation=conversation)
    assert context.messages[-1]["content"] == REDACTED
    assert_context_invariants(conversation)
    again = services.message_redact(conversation=conversation, seq=last.seq)
    assert again.redacted_at == message.redacted_at  # the same text again changes nothing


def test_a_tool_call_keeps_its_id_and_name_but_not_its_arguments(user, offline_summarizer):
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "pay", "arguments": '{"card": "4111"}'},
    }
    conversation = services.conversation_create(
        owner=user,
        messages=[
            {"role": "user", "content": "Pay."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "paid with 4111"},
        ],
    )
    request = services.message_redact(conversation=conversation, seq=1)
    assert request.content is None
    assert request.tool_calls == [{**call, "function": {"name": "pay", "arguments": "{}"}}]
    result = services.message_redact(conversation=conversation, seq=2)
    assert result.as_openai() == {"role": "tool", "tool_call_id": "c1", "content": REDACTED}


def test_redacting_a_missing_message_is_an_error(compacted):
    with pytest.raises(Message.DoesNotExist):
        services.message_redact(conversation=compacted, seq=999)


def test_a_conversation_without_a_summary_has_nothing_to_rebuild(user, offline_summarizer):
    conversation = services.conversation_create(owner=user, messages=TURNS[:2])
    assert (
        services.conversation_rebuild(conversation=conversation).reason
        == Reason.NOTHING_TO_SUMMARIZE
    )


def test_a_failed_rebuild_changes_nothing(compacted, settings):
    before = list(Summary.objects.filter(conversation=compacted).values())
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": "tests.backends.CrashingSummarizer"}
    with pytest.raises(RuntimeError):
        services.conversation_rebuild(conversation=compacted)
    assert list(Summary.objects.filter(conversation=compacted).values()) == before
    compacted.refresh_from_db()
    assert compacted.lease_owner == ""
    attempt = CompactionAttempt.objects.filter(conversation=compacted).latest("created_at")
    assert (attempt.outcome, attempt.reason) == ("failed", "error")


def test_a_compaction_during_the_rebuild_wins_and_the_rebuild_writes_nothing(compacted, settings):
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": "tests.backends.HookSummarizer"}
    HookSummarizer.calls = []

    def compact_meanwhile():
        # The lease is the rebuild's: take it over as an abandoned one would be.
        Conversation.objects.filter(pk=compacted.pk).update(lease_owner="", leased_at=None)
        services.message_append(conversation=compacted, messages=TURNS[:4])
        assert services.conversation_compact(conversation=compacted).compacted

    HookSummarizer.during = compact_meanwhile
    result = services.conversation_rebuild(conversation=compacted)
    assert (result.rebuilt, result.reason) == (False, Reason.CONFLICT)
    assert not Summary.objects.filter(conversation=compacted, origin="rebuild").exists()
    assert_context_invariants(compacted)


def test_the_command_rebuilds_every_stale_summary(compacted, user, settings):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    fresh = services.conversation_create(owner=user, messages=TURNS[:2])  # no summary
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    out = StringIO()
    call_command("ctxsum_rebuild", "--stale", stdout=out)
    assert out.getvalue().strip() == "1 conversation(s): rebuilt 1"
    assert not selectors.stale_summaries().exists()
    assert Summary.objects.filter(conversation=compacted, superseded=True).count() == 1

    out = StringIO()
    call_command("ctxsum_rebuild", str(fresh.pk), str(compacted.pk), stdout=out, verbosity=2)
    lines = out.getvalue().splitlines()
    assert f"{fresh.pk}: nothing_to_summarize" in lines
    assert f"{compacted.pk}: rebuilt (v2 -> v3)" in lines
    with pytest.raises(CommandError, match="not both"):
        call_command("ctxsum_rebuild", str(fresh.pk), "--stale")
