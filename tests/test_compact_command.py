"""The ctxsum_compact management command and the admin actions, which call the service."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from ctxsum.models import Conversation, Summary
from tests.factories import conversation_with_turns

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _short_summaries(settings):
    # A summary smaller than the few short turns it replaces (else: no_gain, by design).
    settings.CTXSUM = {"SUMMARIZER": "tests.backends.HookSummarizer"}


def _conversation(owner, count, **policy):
    return conversation_with_turns(owner, count, system="Sys", **policy)


def _run(*args):
    out = StringIO()
    call_command("ctxsum_compact", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_all_compacts_only_those_over_their_trigger(user):
    over = _conversation(user, 12, trigger={"messages": 10}, keep={"messages": 4})
    under = _conversation(user, 5, trigger={"messages": 10}, keep={"messages": 4})

    output = _run("--all")

    assert "2 conversation(s): below_trigger 1, compacted 1" in output
    assert Summary.objects.filter(conversation=over).count() == 1
    assert not Summary.objects.filter(conversation=under).exists()


def test_dry_run_writes_nothing(user):
    conversation = _conversation(user, 12, trigger={"messages": 10}, keep={"messages": 4})
    revision = Conversation.objects.get(pk=conversation.pk).revision

    output = _run(str(conversation.pk), "--dry-run")

    assert f"{conversation.pk}: dry_run (" in output
    assert not Summary.objects.exists()
    assert Conversation.objects.get(pk=conversation.pk).revision == revision


def test_force_compacts_below_the_trigger(user):
    conversation = _conversation(user, 6, trigger={"messages": 10}, keep={"messages": 2})

    output = _run(str(conversation.pk), "--force")

    assert f"{conversation.pk}: compacted" in output
    assert Summary.objects.get(conversation=conversation).to_seq == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "Name conversation ids or give --all"),
        (("--all", "5b1e7c9e-8f0a-4c52-9a43-1f1b2f1d0c11"), "Name conversation ids or give --all"),
        (("5b1e7c9e-8f0a-4c52-9a43-1f1b2f1d0c11",), "No such conversation"),
        (("not-a-uuid",), "Not a conversation id"),
    ],
)
def test_bad_arguments_are_command_errors(args, message):
    with pytest.raises(CommandError, match=message):
        _run(*args)


def test_failed_compaction_fails_the_command(user, openai_summarizer):
    openai_summarizer.mode = "error"
    conversation = _conversation(user, 12, trigger={"messages": 10}, keep={"messages": 4})

    with pytest.raises(CommandError, match="1 compaction"):
        _run(str(conversation.pk))
    assert not Summary.objects.exists()


def test_admin_pages_and_compact_action(admin_client, user):
    conversation = _conversation(user, 12, trigger={"messages": 10}, keep={"messages": 4})

    for url in (
        reverse("admin:ctxsum_conversation_changelist"),
        reverse("admin:ctxsum_conversation_change", args=[conversation.pk]),
        reverse("admin:ctxsum_message_changelist"),
    ):
        assert admin_client.get(url).status_code == 200

    response = admin_client.post(
        reverse("admin:ctxsum_conversation_changelist"),
        {"action": "compact_now", "_selected_action": [str(conversation.pk)]},
        follow=True,
    )

    assert response.status_code == 200
    summary = Summary.objects.get(conversation=conversation)
    assert "compacted" in response.content.decode()
    for url in (
        reverse("admin:ctxsum_summary_changelist"),
        reverse("admin:ctxsum_summary_change", args=[summary.pk]),
        reverse("admin:ctxsum_compactionattempt_changelist"),
    ):
        assert admin_client.get(url).status_code == 200
