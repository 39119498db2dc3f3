"""A revert racing a compaction, another revert, or an append, on PostgreSQL row locks.

As in tests/test_races.py, each worker is a thread with its own connection, the summarizer
is the real OpenAI backend talking to a local server in "hold" mode, and a worker waiting
on a lock is detected with ``pg_blocking_pids``: no sleep decides an outcome.

- a revert while a compaction holds the lease is ``in_progress`` and writes nothing; the
  compaction then commits as if nothing happened;
- a compaction that commits after the revert read the active summary makes the revert a
  ``conflict``: nothing written, the lease given back;
- of two reverts of the same version, the second finds the lease taken;
- an append and a revert serialize on the row lock, in either order, and both end valid;
  a tool result for a call the revert restores is refused before it and accepted after.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from ctxsum.exceptions import MessagesInvalid
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import context_get
from ctxsum.services import conversation_create, conversation_revert, leases, message_append
from tests.factories import FILLER, assistant_calls, long_user_message, tool_result
from tests.invariants import assert_context_invariants
from tests.postgres import POSTGRES, blocked, compact_held, held_openai, start, wait_until

pytestmark = POSTGRES
POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
HISTORY = [
    long_user_message("u0"),
    assistant_calls("call_x"),
    long_user_message("u2"),
    long_user_message("u3"),
    long_user_message("u4"),
]


@pytest.fixture
def fake(settings, monkeypatch):
    yield from held_openai(settings, monkeypatch, lease_seconds=30)


def compacted(user: Any, fake: Any) -> tuple[Conversation, list[dict[str, Any]]]:
    """HISTORY compacted once (call_x archived without a result), and the context before."""
    conversation = conversation_create(owner=user, messages=HISTORY, **POLICY)
    before = context_get(conversation=conversation).messages
    worker = compact_held(conversation, fake, force=True)
    fake.release()
    outcome = worker.outcome()
    assert outcome.compacted and [row.seq for row in outcome.archived] == [0, 1, 2]
    fake.hold()
    return conversation, before


def revert_in_thread(conversation: Conversation, version: int) -> Any:
    pk = conversation.pk
    return start(
        lambda: conversation_revert(conversation=Conversation.objects.get(pk=pk), version=version)
    )


def versions(conversation: Conversation) -> list[tuple[int, bool, bool]]:
    rows = Summary.objects.filter(conversation=conversation).order_by("version")
    return list(rows.values_list("version", "active", "reverted"))


def more(tag: str) -> list[dict[str, Any]]:
    return [long_user_message(f"{tag} {index}") for index in range(3)]


def test_a_revert_while_a_compaction_holds_the_lease_is_in_progress(user, fake):
    conversation, _ = compacted(user, fake)
    later = more("later")
    message_append(conversation=conversation, messages=later)
    worker = compact_held(conversation, fake, force=True)
    before = (Conversation.objects.get(pk=conversation.pk).revision, versions(conversation))

    result = conversation_revert(conversation=conversation, version=1)

    assert (result.reverted, result.reason) == (False, Reason.IN_PROGRESS)
    assert (Conversation.objects.get(pk=conversation.pk).revision, versions(conversation)) == before
    fake.release()
    assert worker.outcome().compacted  # its lease was never touched
    assert versions(conversation) == [(1, False, False), (2, True, False)]
    assert_context_invariants(conversation, original_messages=[*HISTORY, *later])


def test_a_compaction_committed_after_the_revert_read_makes_it_a_conflict(user, fake, monkeypatch):
    """The revert reads v1 as active; the compaction, held until then, commits v2 and
    gives its lease back before the revert takes the lease: the revert's commit finds v2
    active and writes nothing."""
    conversation, _ = compacted(user, fake)
    later = more("later")
    message_append(conversation=conversation, messages=later)
    worker = compact_held(conversation, fake, force=True)
    real_take = leases.lease_take
    committed: list[Any] = []

    def after_the_compaction(target: Conversation, *, db: str) -> str | None:
        monkeypatch.setattr(leases, "lease_take", real_take)
        fake.release()
        committed.append(worker.outcome())
        return real_take(target, db=db)

    monkeypatch.setattr(leases, "lease_take", after_the_compaction)
    result = conversation_revert(conversation=conversation, version=1)

    assert committed[0].compacted
    assert (result.reverted, result.reason) == (False, Reason.CONFLICT)
    assert versions(conversation) == [(1, False, False), (2, True, False)]
    row = Conversation.objects.get(pk=conversation.pk)
    assert row.lease_owner == "" and row.leased_at is None
    assert not CompactionAttempt.objects.filter(conversation=conversation, reason="reverted")
    assert_context_invariants(conversation, original_messages=[*HISTORY, *later])
    # The newer version can be reverted now that it is the active one.
    assert conversation_revert(conversation=conversation, version=2).reverted


def test_of_two_reverts_of_one_version_the_second_finds_the_lease_taken(user, fake):
    """The first holds the row inside its commit (held on the summary table); the second
    read v1 as active too, and its lease is refused: ``in_progress``, nothing written."""
    conversation, before = compacted(user, fake)

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {Summary._meta.db_table} IN SHARE MODE")
        first = revert_in_thread(conversation, 1)
        assert wait_until(lambda: blocked(first.pid)), "the first revert never waited"
        second = conversation_revert(conversation=conversation, version=1)
        assert (second.reverted, second.reason) == (False, Reason.IN_PROGRESS)

    assert first.outcome().reverted
    assert versions(conversation) == [(1, False, True)]
    assert context_get(conversation=conversation).messages == before
    assert_context_invariants(conversation, original_messages=HISTORY)


def test_an_append_holding_the_row_goes_first_and_the_revert_keeps_it(user, fake):
    """The append holds the conversation row: the revert's lease waits for it, then
    restores the archived messages before the appended one."""
    conversation, before = compacted(user, fake)
    refused = tool_result("call_x", f"call_x: found {FILLER}")
    later = long_user_message("later")

    with transaction.atomic():
        Conversation.objects.select_for_update().get(pk=conversation.pk)
        worker = revert_in_thread(conversation, 1)
        assert wait_until(lambda: blocked(worker.pid)), "the revert never waited for the row"
        message_append(conversation=conversation, messages=[later])
        # Its request is archived until the revert commits: refused.
        with pytest.raises(MessagesInvalid):
            message_append(conversation=conversation, messages=[refused])

    assert worker.outcome().reverted
    assert context_get(conversation=conversation).messages == [*before, later]
    assert_context_invariants(conversation, original_messages=[*HISTORY, later])


def test_a_revert_holding_the_row_goes_first_and_the_append_follows_it(user, fake):
    """The revert holds the conversation row inside its commit (held on the summary
    table): an append of a result for the call it restores waits, then is accepted."""
    conversation, before = compacted(user, fake)
    answer = tool_result("call_x", f"call_x: found {FILLER}")
    pk = conversation.pk

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {Summary._meta.db_table} IN SHARE MODE")
        reverter = revert_in_thread(conversation, 1)
        assert wait_until(lambda: blocked(reverter.pid)), "the revert never waited"
        appender = start(
            lambda: message_append(conversation=Conversation.objects.get(pk=pk), messages=[answer])
        )
        assert wait_until(lambda: blocked(appender.pid)), "the append never waited"
        assert reverter.is_alive() and appender.is_alive()

    assert reverter.outcome().reverted
    (stored,) = appender.outcome().messages
    assert stored.seq == len(HISTORY)
    assert context_get(conversation=conversation).messages == [*before, answer]
    assert not Message.objects.filter(conversation=conversation).archived().exists()
    assert_context_invariants(conversation, original_messages=[*HISTORY, answer])
