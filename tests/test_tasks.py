"""Background compaction (AUTO_COMPACT with COMPACTION_RUNNER "tasks", the default).

An append that reaches the trigger enqueues ``ctxsum.tasks.compact_conversation`` once it
commits, never before and never for a rolled-back append; the task, run by the task
engine's own backends (the immediate one here, a real ``db_worker`` process on
PostgreSQL), leaves exactly what a synchronous compaction leaves; duplicate tasks collapse
through the lease; only a context over MAX_CONTEXT_TOKENS is compacted synchronously. The
other runners: Celery in its eager mode, "sync", and a project's own enqueue callable.
"""

from __future__ import annotations

import importlib
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ctxsum import selectors, services
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.services.autocompact import conversation_compact_queued
from ctxsum.services.leases import lease_release, lease_take
from tests.factories import OFFLINE_SUMMARIZER, long_user_message, system_message
from tests.invariants import assert_context_invariants
from tests.postgres import POSTGRES, wait_until
from tests.settings import TASKS_MODULE
from tests.test_killed_worker import start_db_worker, stop_db_worker

tasks_framework = importlib.import_module(TASKS_MODULE)
task_signals = importlib.import_module(f"{TASKS_MODULE}.signals")
IMMEDIATE = {"default": {"BACKEND": f"{TASKS_MODULE}.backends.immediate.ImmediateBackend"}}
DUMMY = {"default": {"BACKEND": f"{TASKS_MODULE}.backends.dummy.DummyBackend"}}
DATABASE = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
SYSTEM = system_message("You book trips.")
COUNTERS = ("next_seq", "message_count", "active_message_count", "active_tokens", "revision")
# A project's own runner (COMPACTION_RUNNER as a dotted path): what it was handed.
handed: list[tuple[str, str]] = []


def collect(conversation_id: str, database: str) -> None:
    handed.append((conversation_id, database))


@pytest.fixture
def auto(settings):
    """AUTO_COMPACT as shipped (runner "tasks"), the offline summarizer, the dummy backend."""
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}
    settings.TASKS = DUMMY
    handed.clear()


def queued() -> list[Any]:
    """What the dummy backend holds: the tasks enqueued and not run."""
    return list(tasks_framework.task_backends["default"].results)


def history(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [long_user_message(f"u{index}") for index in range(start, start + count)]


def new_conversation(owner: Any, count: int = 4) -> Conversation:
    return services.conversation_create(
        owner=owner, system=SYSTEM["content"], messages=history(count), **POLICY
    )


def state(conversation: Conversation) -> dict[str, Any]:
    """Everything a compaction changes, without ids and times."""
    row = Conversation.objects.filter(pk=conversation.pk).values(*COUNTERS, "lease_owner").get()
    summaries = Summary.objects.filter(conversation=conversation).order_by("version")
    attempts = CompactionAttempt.objects.filter(conversation=conversation).order_by("id")
    return {
        "row": row,
        "summaries": list(
            summaries.values_list("version", "text", "from_seq", "to_seq", "token_count", "active")
        ),
        "archived": list(
            Message.objects.filter(conversation=conversation)
            .order_by("seq")
            .values_list("seq", "summary__version")
        ),
        "attempts": list(
            attempts.values_list("outcome", "reason", "from_seq", "to_seq", "messages_archived")
        ),
        "context": selectors.context_get(conversation=conversation).messages,
    }


@pytest.mark.django_db(transaction=True)
def test_an_append_that_reaches_the_trigger_enqueues_a_task_once_it_commits(user, auto):
    conversation = new_conversation(user, count=3)
    below = services.message_append(conversation=conversation, messages=history(1, 3))
    assert below.compaction.reason == Reason.BELOW_TRIGGER  # 5 messages
    assert queued() == []
    reached = services.message_append(conversation=conversation, messages=history(1, 4))

    assert reached.compaction.reason == Reason.QUEUED and not reached.compaction.compacted
    [result] = queued()
    assert result.task.module_path == "ctxsum.tasks.compact_conversation"
    assert list(result.args) == [str(conversation.pk), "default"]
    assert result.status == "READY"
    # Queued, not run: the context is as the append left it.
    assert not Summary.objects.filter(conversation=conversation).exists()
    assert conversation.active_message_count == 6


@pytest.mark.django_db(transaction=True)
def test_an_append_inside_a_callers_transaction_enqueues_after_its_commit(user, auto):
    conversation = new_conversation(user)
    with transaction.atomic():
        appended = services.message_append(conversation=conversation, messages=history(2, 4))
        assert appended.compaction.reason == Reason.QUEUED
        assert queued() == []  # not while the caller's transaction may still roll back
    assert len(queued()) == 1


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_append_enqueues_nothing(user, auto):
    conversation = new_conversation(user)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.message_append(conversation=conversation, messages=history(2, 4))
        raise RuntimeError("the caller changes its mind")
    assert queued() == []
    assert Message.objects.filter(conversation=conversation).count() == 5
    # Creating a conversation whose first messages reach the trigger is an append too.
    with pytest.raises(RuntimeError), transaction.atomic():
        new_conversation(user, count=8)
        raise RuntimeError("rolled back")
    assert queued() == []
    new_conversation(user, count=8)
    assert len(queued()) == 1


@pytest.mark.django_db(transaction=True)
def test_the_task_leaves_exactly_what_a_synchronous_compaction_leaves(
    user, django_user_model, auto, settings
):
    """Two users build the same conversation; one compacts synchronously, the other's
    compaction goes through the task engine's immediate backend."""
    finished: list[Any] = []

    def record(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result)

    twin = django_user_model.objects.create_user(username="bob", password="pw")
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER, "COMPACTION_RUNNER": "sync"}
    synchronous = new_conversation(user)
    sync_answer = services.message_append(conversation=synchronous, messages=history(2, 4))
    assert sync_answer.compaction.compacted, sync_answer.compaction

    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}  # runner "tasks"
    settings.TASKS = IMMEDIATE
    background = new_conversation(twin)
    task_signals.task_finished.connect(record)
    try:
        answer = services.message_append(conversation=background, messages=history(2, 4))
    finally:
        task_signals.task_finished.disconnect(record)

    assert answer.compaction.reason == Reason.QUEUED
    [result] = finished
    assert result.status == "SUCCESSFUL", result.errors
    assert result.return_value == {
        "compacted": True,
        "reason": "compacted",
        "summary_version": 1,
        "over_trigger": False,
        "detail": "",
        "cause": "",
    }
    assert state(background) == state(synchronous)
    assert_context_invariants(background, original_messages=[SYSTEM, *history(6)])


@pytest.mark.django_db(transaction=True)
def test_duplicate_tasks_collapse_through_the_lease(user, auto, settings):
    conversation = new_conversation(user)
    for start in (4, 5):  # both appends reach the trigger: two tasks
        answer = services.message_append(conversation=conversation, messages=history(1, start))
        assert answer.compaction.reason == Reason.QUEUED
    first, second = queued()
    from ctxsum.tasks import compact_conversation

    settings.TASKS = IMMEDIATE
    # While another worker holds the lease, a task collapses into it: no call, no attempt.
    token = lease_take(conversation, db="default")
    assert token is not None
    held = compact_conversation.enqueue(*first.args)
    assert held.return_value["reason"] == Reason.IN_PROGRESS
    assert not CompactionAttempt.objects.filter(conversation=conversation).exists()
    lease_release(conversation, token, db="default")

    ran = [compact_conversation.enqueue(*result.args) for result in (first, second)]
    assert [r.return_value["reason"] for r in ran] == ["compacted", "below_trigger"]
    assert Summary.objects.filter(conversation=conversation).count() == 1
    assert list(CompactionAttempt.objects.values_list("reason", flat=True)) == ["compacted"]
    assert_context_invariants(conversation, original_messages=[SYSTEM, *history(6)])


@pytest.mark.django_db(transaction=True)
def test_a_task_for_a_deleted_conversation_does_nothing(user, auto):
    conversation = new_conversation(user)
    pk = str(conversation.pk)
    services.conversation_delete(conversation=conversation)
    result = conversation_compact_queued(conversation_id=pk, database="default")
    assert (result.compacted, result.reason) == (False, Reason.CONFLICT)


@pytest.mark.django_db(transaction=True)
def test_only_a_context_over_max_context_tokens_compacts_synchronously(user, auto):
    conversation = services.conversation_create(
        owner=user, system=SYSTEM["content"], messages=history(2), **POLICY
    )
    ceiling = conversation.context_tokens + 2 * Message.objects.last().token_count - 1
    services.conversation_update(conversation=conversation, max_context_tokens=ceiling)
    within = services.message_append(conversation=conversation, messages=history(1, 2))
    assert within.compaction.reason == Reason.BELOW_TRIGGER

    over = services.message_append(conversation=conversation, messages=history(1, 3))

    # Over the ceiling, below the message trigger: compacted in this process, no task.
    assert over.compaction.compacted and over.compaction.reason == Reason.COMPACTED
    assert queued() == []
    assert conversation.context_tokens <= ceiling
    assert_context_invariants(conversation, original_messages=[SYSTEM, *history(4)])


@pytest.mark.django_db(transaction=True)
def test_a_failed_task_records_the_failure_and_leaves_the_append(user, auto, settings):
    conversation = new_conversation(user)
    services.message_append(conversation=conversation, messages=history(2, 4))
    [result] = queued()
    settings.CTXSUM = {"SUMMARIZER": "tests.backends.CrashingSummarizer"}
    settings.TASKS = IMMEDIATE
    from ctxsum.tasks import compact_conversation

    ran = compact_conversation.enqueue(*result.args)

    assert ran.status == "FAILED"  # the engine sees it; no retry is made
    attempt = CompactionAttempt.objects.get(conversation=conversation)
    assert (attempt.outcome, attempt.reason) == ("failed", Reason.ERROR)
    assert Message.objects.filter(conversation=conversation).active().count() == 7
    conversation.refresh_from_db()
    assert conversation.lease_owner == ""


@pytest.mark.django_db(transaction=True)
def test_celery_runs_the_same_compaction_in_eager_mode(user, auto, settings):
    from celery import Celery

    app = Celery("ctxsum-tests", set_as_current=True)
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER, "COMPACTION_RUNNER": "celery"}
    conversation = new_conversation(user)

    answer = services.message_append(conversation=conversation, messages=history(2, 4))

    assert answer.compaction.reason == Reason.QUEUED
    assert queued() == []  # not Django's tasks framework
    assert Summary.objects.filter(conversation=conversation, active=True).count() == 1
    assert_context_invariants(conversation, original_messages=[SYSTEM, *history(6)])


@pytest.mark.django_db(transaction=True)
def test_a_projects_own_runner_gets_the_conversation_and_database(user, auto, settings):
    settings.CTXSUM = {
        "SUMMARIZER": OFFLINE_SUMMARIZER,
        "COMPACTION_RUNNER": f"{__name__}.collect",
    }
    conversation = new_conversation(user)
    services.message_append(conversation=conversation, messages=history(2, 4))
    assert handed == [(str(conversation.pk), "default")]
    result = conversation_compact_queued(conversation_id=handed[0][0], database=handed[0][1])
    assert result.compacted


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"COMPACTION_RUNNER": "no.such.enqueue"}, "cannot be loaded"),
        ({"COMPACTION_RUNNER": "ctxsum.policy.UNITS"}, "is not callable"),
        ({"AUTO_COMPACT": "yes"}, "must be True or False"),
    ],
)
def test_a_bad_runner_is_a_system_check_error(settings, overrides, expected):
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER, **overrides}
    errors = [e for e in run_checks() if e.id == "ctxsum.E020"]
    assert len(errors) == 1 and expected in errors[0].msg


def test_every_runner_by_name_passes_the_checks(settings):
    for runner in ("tasks", "celery", "sync"):
        settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER, "COMPACTION_RUNNER": runner}
        assert not [e for e in run_checks() if e.id == "ctxsum.E020"], runner


# The multi-database pattern of tests/test_multi_db.py: ctxsum's rows on "other" only.
class OtherDatabaseRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "other"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "other"


@pytest.mark.django_db(databases=["default", "other"], transaction=True)
def test_the_task_compacts_on_the_routed_database(auto, settings):
    settings.DATABASE_ROUTERS = [f"{__name__}.OtherDatabaseRouter"]
    settings.TASKS = IMMEDIATE
    owner = get_user_model().objects.create_user(username="ada", password="pw")
    conversation = new_conversation(owner)
    with transaction.atomic(using="other"):
        answer = services.message_append(conversation=conversation, messages=history(2, 4))
        assert answer.compaction.reason == Reason.QUEUED
        # Enqueued after the commit on "other", the database the append wrote to.
        assert not Summary.objects.using("other").exists()
    assert Summary.objects.using("other").filter(conversation=conversation).count() == 1
    assert not Conversation.objects.using("default").exists()
    assert not Summary.objects.using("default").exists()


# PostgreSQL: a real db_worker process runs the queued compactions while appends go on.
WORKER_LEASE_SECONDS = 30


@pytest.fixture
def worker_fake(settings, monkeypatch) -> Iterator[Any]:
    from tests.postgres import held_openai

    yield from held_openai(settings, monkeypatch, lease_seconds=WORKER_LEASE_SECONDS, timeout=30)


def start_worker(fake: Any) -> subprocess.Popen[str]:
    return start_db_worker(fake, CTXSUM_LEASE_SECONDS=str(WORKER_LEASE_SECONDS))


def postgres(test: Any) -> Any:
    for mark in POSTGRES:
        test = mark(test)
    return test


def unfinished() -> Any:
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult.objects.exclude(status__in=["SUCCESSFUL", "FAILED"])


# run_after of a task enqueued without one (django-tasks-db stores the largest date).
NOT_DEFERRED = Q(run_after__year=9999)


def tasks_settled() -> bool:
    """Every task has run but the checks deferred by compactions, which wait their lease time
    (services/autocompact.py)."""
    return not unfinished().filter(Q(run_after__lte=timezone.now()) | NOT_DEFERRED).exists()


def append_while_held(conversation: Conversation, appended: list[Any], seqs: range) -> None:
    """Append one message at a time while the worker's summarizer call is held: never
    blocked, and the context stays whole after each."""
    for start in seqs:
        message = history(1, start)
        appended += message
        began = time.monotonic()
        services.message_append(conversation=conversation, messages=message)
        assert time.monotonic() - began < 5, "an append waited for the compaction"
        assert_context_invariants(conversation, original_messages=[SYSTEM, *appended])


@postgres
def test_a_db_worker_compacts_while_appends_go_on(user, worker_fake, settings):
    from django_tasks_db.models import DBTaskResult

    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "tasks"}
    settings.TASKS = DATABASE
    appended = history(4)
    conversation = new_conversation(user)
    worker = start_worker(worker_fake)
    try:
        more = history(2, 4)
        appended += more
        answer = services.message_append(conversation=conversation, messages=more)
        assert answer.compaction.reason == Reason.QUEUED
        # The worker takes the task and the lease, and its summarizer call is held.
        assert worker_fake.wait_for_in_flight(1, timeout=30), "the worker never called"
        append_while_held(conversation, appended, range(6, 12))
        assert not Summary.objects.filter(conversation=conversation).exists()

        # The first task commits; the tasks queued by the appends during its call collapse
        # into it or compact what arrived meanwhile. Then every task has finished.
        worker_fake.release()
        assert wait_until(tasks_settled, timeout=60), "the worker left tasks unrun"
        for start in range(12, 16):  # more appends after the compaction
            message = history(1, start)
            appended += message
            services.message_append(conversation=conversation, messages=message)
        assert wait_until(tasks_settled, timeout=60), "the worker left tasks unrun"
    finally:
        output = stop_db_worker(worker)

    statuses = set(
        DBTaskResult.objects.exclude(pk__in=unfinished()).values_list("status", flat=True)
    )
    assert statuses == {"SUCCESSFUL"}, output
    assert DBTaskResult.objects.count() >= 2
    # What is left: checks deferred by the compactions, each with the time it started.
    for check in unfinished():
        assert check.status == "READY" and check.run_after > timezone.now()
        assert len(check.args_kwargs["args"]) == 3
    assert Summary.objects.filter(conversation=conversation).exists()
    conversation.refresh_from_db()
    assert conversation.lease_owner == ""
    assert Message.objects.filter(conversation=conversation).count() == 1 + len(appended)
    assert_context_invariants(conversation, original_messages=[SYSTEM, *appended])
    # Every compaction committed; a duplicate left no attempt of its own.
    attempts = CompactionAttempt.objects.filter(conversation=conversation)
    outcomes = set(attempts.values_list("outcome", flat=True))
    assert outcomes == {"compacted"}, outcomes
