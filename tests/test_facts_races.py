"""Key facts of a subject under concurrency, on PostgreSQL row locks: a compaction's commit
and a person's edit of the subject's facts lock the subject's conversations in primary-key
order, and a person's edit takes the owner's row before them FOR NO KEY UPDATE, which the
foreign-key check of a compaction's new fact (FOR KEY SHARE on the owner's row, at its
commit) does not wait for: no deadlock, whichever comes first. A commit with no fact to
write locks its own row only.

As in tests/test_races.py, each worker is a thread with its own connection, the summarizer
is the real OpenAI backend talking to a local server in "hold" mode, and a worker waiting
on a lock is detected with ``pg_blocking_pids``: no sleep decides an outcome.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from ctxsum.facts import hooks as fact_hooks
from ctxsum.facts.block import conversations_lock, facts_recount
from ctxsum.facts.lines import fact_tokens
from ctxsum.facts.models import Fact
from ctxsum.facts.services import fact_add
from ctxsum.models import Conversation
from ctxsum.selectors import context_get
from ctxsum.services import conversation_create
from tests.factories import assistant_message, long_user_message
from tests.invariants import assert_context_invariants
from tests.postgres import POSTGRES, blocked, compact_held, held_openai, start, wait_until

pytestmark = POSTGRES
SUBJECT = "customer-42"
HISTORY = [
    long_user_message("u0"),
    assistant_message("Noted."),
    long_user_message("u2"),
    assistant_message("Noted again."),
    long_user_message("u4"),
]


@pytest.fixture
def fake(settings, monkeypatch):
    yield from held_openai(settings, monkeypatch, lease_seconds=30)


def subject_pair(user: Any) -> tuple[Conversation, Conversation]:
    """Two conversations of ``user`` naming the subject, lower primary key first."""
    conversations = [
        conversation_create(
            owner=user,
            subject=SUBJECT,
            messages=HISTORY,
            trigger={"messages": 5},
            keep={"messages": 1},
        )
        for _ in range(2)
    ]
    low, high = sorted(conversations, key=lambda conversation: conversation.pk)
    return low, high


def test_a_persons_edit_and_a_compaction_of_the_subject_do_not_deadlock(user, fake):
    """The edit holds the lower conversation and, after the compaction's commit started
    waiting, takes the higher one, which is the one being compacted: the commit must not
    hold it yet. Locking its own row first would deadlock here."""
    low, high = subject_pair(user)
    fake.facts = [{"key": "plan", "value": "gold", "source_seqs": [0]}]
    holding_low, go_on = threading.Event(), threading.Event()

    def edit() -> None:
        with transaction.atomic():
            list(Conversation.objects.select_for_update().filter(pk=low.pk))
            holding_low.set()
            assert go_on.wait(10)
            locked = conversations_lock(db="default", owner_id=user.pk, subject=SUBJECT)
            Fact.objects.create(
                owner=user,
                subject=SUBJECT,
                key="vat",
                value="ES-B123",
                changed_by=Fact.ChangedBy.PERSON,
                confirmed_at=timezone.now(),
                token_count=fact_tokens("vat", "ES-B123"),
            )
            facts_recount(locked)

    compaction = compact_held(high, fake, force=True)
    editor = start(edit)
    assert holding_low.wait(10)
    fake.release()
    # The commit waits for the lower row, holding none of the subject's rows.
    assert wait_until(lambda: blocked(compaction.pid))
    go_on.set()
    editor.outcome()

    result = compaction.outcome()

    assert result.compacted
    keys = sorted(Fact.objects.filter(subject=SUBJECT).values_list("key", flat=True))
    assert keys == ["plan", "vat"]
    for conversation in (low, high):
        assert_context_invariants(conversation)
        shown = context_get(conversation=conversation).shown("facts")
        assert {fact.key for fact in shown} == {"plan", "vat"}


def test_two_compactions_of_one_subject_commit_one_after_the_other(user, fake):
    """Both commits merge into the subject's facts and lock both conversations, in the same
    order: released together, one waits for the other, and both commit."""
    low, high = subject_pair(user)
    fake.facts = [{"key": "plan", "value": "gold", "source_seqs": [0]}]
    first = compact_held(low, fake, force=True)
    second = compact_held(high, fake, force=True)
    assert fake.wait_for_in_flight(2)

    fake.release()

    assert first.outcome().compacted and second.outcome().compacted
    (plan,) = Fact.objects.filter(subject=SUBJECT)
    assert plan.value == "gold" and plan.changes.count() == 2  # created, then confirmed
    for conversation in (low, high):
        assert_context_invariants(conversation)


def test_a_persons_subject_fact_and_a_compaction_writing_one_do_not_deadlock_on_the_owner(
    user, fake, monkeypatch
):
    """The compaction's commit holds the subject's conversations and has inserted a fact;
    a person's write of a subject fact takes the owner's row, then waits for those
    conversations. At its commit the compaction's foreign-key check of the new fact's owner
    takes a key-share lock on that row: the person's lock of it must not conflict (FOR NO
    KEY UPDATE), or each waits for the other."""
    low, high = subject_pair(user)
    fake.facts = [{"key": "plan", "value": "gold", "source_seqs": [0]}]
    merged, go_on = threading.Event(), threading.Event()
    original = fact_hooks.facts_commit

    def facts_commit(**kwargs: Any) -> None:
        original(**kwargs)
        merged.set()
        assert go_on.wait(15)

    monkeypatch.setattr(fact_hooks, "facts_commit", facts_commit)
    compaction = compact_held(high, fake, force=True)
    fake.release()
    assert merged.wait(15)  # the commit holds both conversations, the new fact inserted
    person = start(lambda: fact_add(user=user, subject=SUBJECT, key="vat", value="ES-B123"))
    assert wait_until(lambda: blocked(person.pid))  # the owner's row taken, waits for low
    go_on.set()

    assert compaction.outcome().compacted
    person.outcome()
    keys = sorted(Fact.objects.filter(subject=SUBJECT).values_list("key", flat=True))
    assert keys == ["plan", "vat"]
    for conversation in (low, high):
        assert_context_invariants(conversation)


def test_a_compaction_without_facts_does_not_wait_for_its_subjects_conversations(user, fake):
    """Its commit writes no fact: it locks its own row only, so another transaction holding
    a sibling's row (an append to it, say) does not hold it up."""
    low, high = subject_pair(user)
    fake.facts = []
    compaction = compact_held(high, fake, force=True)
    with transaction.atomic():
        list(Conversation.objects.select_for_update().filter(pk=low.pk))
        fake.release()
        assert compaction.outcome(timeout=10).compacted
    assert_context_invariants(high)
