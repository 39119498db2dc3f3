"""The deferred runs of the compaction task, which retry a background compaction lost with
its worker (on any database the suite runs on; tests/test_killed_worker.py kills a real
``db_worker`` on PostgreSQL).

A task that compacts first defers its own check to one lease time later; the check
compacts only if that compaction recorded no outcome (its worker was killed, or
interrupted). A task that finds a live lease held by another worker, with work due, runs
again when that lease expires instead of dropping the work. Nothing is deferred on a
backend that runs tasks at once, and ``ctxsum_compact --due`` does by hand what the
deferred runs do.
"""

from __future__ import annotations

import importlib
import logging
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.utils import timezone

from ctxsum.models import CompactionAttempt, Conversation, Summary
from ctxsum.policy import Reason
from ctxsum.services import conversation_create, conversation_update
from ctxsum.services.autocompact import CHECKED, compaction_due
from ctxsum.services.leases import lease_take
from tests.factories import OFFLINE_SUMMARIZER, long_user_message, system_message
from tests.invariants import assert_context_invariants
from tests.settings import TASKS_MODULE

pytestmark = pytest.mark.django_db

tasks_framework = importlib.import_module(TASKS_MODULE)
DummyBackend = importlib.import_module(f"{TASKS_MODULE}.backends.dummy").DummyBackend
DUMMY = {"default": {"BACKEND": f"{TASKS_MODULE}.backends.dummy.DummyBackend"}}
IMMEDIATE = {"default": {"BACKEND": f"{TASKS_MODULE}.backends.immediate.ImmediateBackend"}}
LEASE_SECONDS = 30
SYSTEM = system_message("You book trips.")
HISTORY = [long_user_message(f"u{index}") for index in range(6)]
POLICY = {"trigger": {"messages": 5}, "keep": {"messages": 1}}


class NoDeferBackend(DummyBackend):  # type: ignore[misc,valid-type]
    """A task backend that cannot run a task later (no ``run_after``)."""

    supports_defer = False


@pytest.fixture(autouse=True)
def _settings(settings: Any) -> None:
    # A short summary and no key facts: one compaction leaves the context below its trigger.
    settings.CTXSUM = {
        "SUMMARIZER": "tests.backends.HookSummarizer",
        "LEASE_SECONDS": LEASE_SECONDS,
        "AUTO_COMPACT": False,  # the tests run the task themselves
    }
    settings.TASKS = DUMMY


def queued() -> list[Any]:
    """What the dummy backend holds: the tasks enqueued and not run."""
    backend = tasks_framework.task_backends["default"]
    results = list(backend.results)
    backend.clear()
    return results


def run(*args: Any) -> dict[str, Any]:
    """Run the compaction task here, as a worker would; its deferrals go to the backend."""
    from ctxsum.tasks import compact_conversation

    result: dict[str, Any] = compact_conversation.call(*args)
    return result


def due_conversation(owner: Any) -> Conversation:
    conversation = conversation_create(
        owner=owner, system=SYSTEM["content"], messages=HISTORY, **POLICY
    )
    assert compaction_due(conversation)
    return conversation


def lose_lease(conversation: Conversation) -> datetime:
    """What a worker killed mid-call leaves, once its lease time has passed: a lease
    taken, never renewed nor released, now abandoned. When it was taken."""
    assert lease_take(conversation, db="default") is not None
    taken = timezone.now() - timedelta(seconds=LEASE_SECONDS + 1)
    Conversation.objects.filter(pk=conversation.pk).update(leased_at=taken)
    return taken


def reasons(conversation: Conversation) -> list[str]:
    rows = CompactionAttempt.objects.filter(conversation=conversation).order_by("id")
    return list(rows.values_list("reason", flat=True))


def test_a_task_that_compacts_first_defers_its_check_by_one_lease_time(user):
    conversation = due_conversation(user)
    before = timezone.now()

    ran = run(str(conversation.pk), "default")

    assert (ran["compacted"], ran["reason"]) == (True, Reason.COMPACTED)
    [check] = queued()
    pk, database, since = check.args
    assert (pk, database) == (str(conversation.pk), "default")
    started = datetime.fromisoformat(since)
    assert before <= started <= timezone.now()
    assert check.task.run_after == started + timedelta(seconds=LEASE_SECONDS)

    # The compaction it follows ended: the check finds nothing to do, and defers nothing.
    assert run(*check.args)["reason"] == Reason.BELOW_TRIGGER
    assert queued() == []
    assert reasons(conversation) == [Reason.COMPACTED]


@pytest.mark.parametrize(
    ("lease_left", "recorded"),
    [
        (True, None),  # killed: its lease left behind, nothing recorded
        (True, Reason.IN_PROGRESS),  # and another compaction turned away by that lease
        (False, Reason.INTERRUPTED),  # stopped inside the call: lease released, recorded
        (True, Reason.INTERRUPTED),  # the same, on a database that refused the release
    ],
)
def test_a_check_after_a_compaction_lost_with_its_worker_compacts(user, lease_left, recorded):
    """The compaction the check follows was lost: the check does its work."""
    conversation = due_conversation(user)
    taken = lose_lease(conversation)
    since = (taken - timedelta(milliseconds=5)).isoformat()
    if not lease_left:
        Conversation.objects.filter(pk=conversation.pk).update(lease_owner="", leased_at=None)
    if recorded is not None:
        CompactionAttempt.objects.create(
            conversation=conversation, outcome="failed", reason=recorded
        )

    ran = run(str(conversation.pk), "default", since)

    assert (ran["compacted"], ran["reason"]) == (True, Reason.COMPACTED)
    assert Summary.objects.filter(conversation=conversation, active=True).count() == 1
    conversation.refresh_from_db()
    assert conversation.lease_owner == "" and not compaction_due(conversation)
    assert_context_invariants(conversation, original_messages=[SYSTEM, *HISTORY])
    # The check compacted under a lease of its own, so it deferred a check of its own.
    [check] = queued()
    assert check.args[:2] == [str(conversation.pk), "default"]
    assert datetime.fromisoformat(check.args[2]) > taken


@pytest.mark.parametrize("recorded", [Reason.SUMMARIZER_ERROR, Reason.NO_GAIN, Reason.ERROR])
def test_a_check_after_a_compaction_that_recorded_its_outcome_does_nothing(user, recorded):
    """A failed compaction is not retried by its check (nor one that gave no gain): the
    next append over the trigger enqueues again, as before."""
    conversation = due_conversation(user)
    since = timezone.now().isoformat()
    CompactionAttempt.objects.create(conversation=conversation, outcome="failed", reason=recorded)

    ran = run(str(conversation.pk), "default", since)

    assert ran == {
        "compacted": False,
        "reason": recorded,
        "summary_version": None,
        "over_trigger": False,
        "detail": str(CHECKED),
        "cause": "",
    }
    assert queued() == []
    assert not Summary.objects.filter(conversation=conversation).exists()
    assert reasons(conversation) == [recorded]


def test_a_check_after_a_compaction_that_found_nothing_to_do_ends_the_chain(user):
    """The row's counters said due, the plan said below the trigger (a replaced system
    prompt counts as a summary would): no lease taken, nothing recorded. Its check ends
    there, deferring nothing: no chain of checks for a conversation that stays so."""
    conversation = conversation_create(
        owner=user, system="You book trips.", messages=HISTORY[:3], **POLICY
    )
    conversation_update(conversation=conversation, system="You book trains.")
    assert compaction_due(conversation)

    assert run(str(conversation.pk), "default")["reason"] == Reason.BELOW_TRIGGER
    [check] = queued()
    checked = run(*check.args)

    assert (checked["reason"], checked["detail"]) == (Reason.BELOW_TRIGGER, str(CHECKED))
    assert queued() == []
    assert reasons(conversation) == []


def test_a_task_that_finds_a_live_lease_runs_again_when_it_expires(user):
    conversation = due_conversation(user)
    assert lease_take(conversation, db="default") is not None
    conversation.refresh_from_db()
    expires = conversation.leased_at + timedelta(seconds=LEASE_SECONDS)

    held = run(str(conversation.pk), "default")

    assert held["reason"] == Reason.IN_PROGRESS
    assert reasons(conversation) == []  # a duplicate records nothing
    [again] = queued()
    assert again.args == [str(conversation.pk), "default", None]
    assert again.task.run_after == expires

    # The holder was lost: by then its lease is abandoned, and the deferred task compacts.
    Conversation.objects.filter(pk=conversation.pk).update(
        leased_at=timezone.now() - timedelta(seconds=LEASE_SECONDS + 1)
    )
    assert run(*again.args)["reason"] == Reason.COMPACTED
    assert Summary.objects.filter(conversation=conversation).count() == 1


def test_a_check_that_finds_the_lease_renewed_waits_for_its_new_expiry(user):
    """A long compaction renews its lease before each call: its check waits, keeping what
    it checks (``since``)."""
    conversation = due_conversation(user)
    since = timezone.now().isoformat()
    assert lease_take(conversation, db="default") is not None
    conversation.refresh_from_db()

    assert run(str(conversation.pk), "default", since)["reason"] == Reason.IN_PROGRESS

    [again] = queued()
    assert again.args == [str(conversation.pk), "default", since]
    assert again.task.run_after == conversation.leased_at + timedelta(seconds=LEASE_SECONDS)


def test_below_the_trigger_a_task_defers_nothing(user):
    conversation = conversation_create(owner=user, messages=HISTORY[:2], **POLICY)
    assert run(str(conversation.pk), "default")["reason"] == Reason.BELOW_TRIGGER
    assert queued() == []


def test_a_backend_that_runs_tasks_at_once_is_given_nothing_to_defer(user, settings, caplog):
    settings.TASKS = IMMEDIATE
    from ctxsum.tasks import compact_conversation

    conversation = due_conversation(user)
    with caplog.at_level(logging.WARNING):
        result = compact_conversation.enqueue(str(conversation.pk), "default")
    assert result.status == "SUCCESSFUL" and result.return_value["compacted"]
    assert reasons(conversation) == [Reason.COMPACTED]
    # Not asked to defer at all: no error logged (the immediate backend refuses run_after).
    assert [record.getMessage() for record in caplog.records] == []


def test_a_backend_that_cannot_defer_is_a_warning(settings):
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}
    assert not [e for e in run_checks() if e.id == "ctxsum.W006"]
    settings.TASKS = {"default": {"BACKEND": f"{__name__}.NoDeferBackend"}}
    [warning] = [e for e in run_checks() if e.id == "ctxsum.W006"]
    assert "NoDeferBackend cannot defer a task" in warning.msg
    assert "ctxsum_compact --due" in warning.hint
    settings.TASKS = IMMEDIATE  # runs the compaction in the appending process: nothing lost
    assert not [e for e in run_checks() if e.id == "ctxsum.W006"]


def compact_due(*args: str) -> str:
    out = StringIO()
    call_command("ctxsum_compact", "--due", *args, "-v", "2", stdout=out, stderr=StringIO())
    return out.getvalue()


def test_ctxsum_compact_due_compacts_what_is_due_and_not_leased(user):
    lost = due_conversation(user)
    lose_lease(lost)
    leased = due_conversation(user)
    assert lease_take(leased, db="default") is not None
    below = conversation_create(owner=user, messages=HISTORY[:2], **POLICY)

    output = compact_due()

    assert f"{lost.pk}: compacted" in output
    assert f"{leased.pk}: in_progress" in output
    assert f"{below.pk}: below_trigger" in output
    assert "3 conversation(s): below_trigger 1, compacted 1, in_progress 1" in output
    assert reasons(lost) == [Reason.COMPACTED]
    assert reasons(leased) == [] and reasons(below) == []
    assert queued() == []  # an operator's run defers nothing


@pytest.mark.parametrize("extra", [["--all"], ["--force"], ["--dry-run"], ["some-id"]])
def test_ctxsum_compact_due_stands_alone(extra):
    with pytest.raises(CommandError):
        compact_due(*extra)


def test_celery_defers_with_an_eta_and_not_in_eager_mode(monkeypatch):
    from types import SimpleNamespace

    from ctxsum import celery_tasks

    sent: list[tuple[Any, Any]] = []
    conf = SimpleNamespace(task_always_eager=True)
    task = SimpleNamespace(
        app=SimpleNamespace(conf=conf), apply_async=lambda args, eta: sent.append((args, eta))
    )
    monkeypatch.setattr(celery_tasks, "compact_conversation", task)
    when = timezone.now() + timedelta(seconds=LEASE_SECONDS)
    celery_tasks.compaction_defer("c-1", "default", when, None)
    assert sent == []  # eager: a task runs inside the call, there is no later
    conf.task_always_eager = False
    celery_tasks.compaction_defer("c-1", "default", when, "2026-01-01T00:00:00+00:00")
    assert sent == [(("c-1", "default", "2026-01-01T00:00:00+00:00"), when)]
