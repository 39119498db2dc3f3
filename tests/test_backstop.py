"""The backstop when no worker runs the compaction tasks: a ceiling in force even with
MAX_CONTEXT_TOKENS unset (the model's context window less its largest reply), which the
appending process enforces at once; the admin pointing out compactions queued for more than
a minute; and a system check naming the worker a task backend needs."""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from ctxsum import services
from ctxsum.models import CompactionAttempt, Conversation
from ctxsum.policy import FALLBACK_WINDOW, default_ceiling
from ctxsum.selectors import conversation_effective_policy, conversation_policy
from ctxsum.services.autocompact import compaction_due
from tests.factories import OFFLINE_SUMMARIZER, user_message
from tests.settings import TASKS_MODULE

pytestmark = pytest.mark.django_db

tasks_framework = importlib.import_module(TASKS_MODULE)
BACKENDS = {
    name: {"default": {"BACKEND": path}}
    for name, path in {
        "dummy": f"{TASKS_MODULE}.backends.dummy.DummyBackend",
        "immediate": f"{TASKS_MODULE}.backends.immediate.ImmediateBackend",
        "database": "django_tasks_db.DatabaseBackend",
    }.items()
}
# The default model's ceiling: gpt-4o-mini's window less its largest reply.
CEILING = 128_000 - 16_384


@pytest.fixture
def no_worker(settings):
    """AUTO_COMPACT as shipped (the "tasks" runner, no MAX_CONTEXT_TOKENS) on the dummy
    backend, which keeps every task it is given and runs none: no worker."""
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}
    settings.TASKS = BACKENDS["dummy"]


def queued() -> list[Any]:
    return list(tasks_framework.task_backends["default"].results)


def sizeable(tag: str, words: int = 170) -> dict[str, Any]:
    """A user message of ``words`` words of its own, about six tokens each."""
    return user_message(" ".join(f"{tag}-{index}" for index in range(words)))


# --- the default ceiling ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "ceiling"),
    [
        ("gpt-4o-mini", CEILING),
        ("gpt-4o-2024-08-06", CEILING),
        ("GPT-4o", CEILING),
        ("gpt-4.1-nano", 1_047_576 - 32_768),
        ("gpt-5-mini", 400_000 - 128_000),
        ("o3", 200_000 - 100_000),
        ("o4-mini-2025-04-16", 200_000 - 100_000),
        ("o1-mini", 128_000 - 65_536),
        ("llama-3.1-8b", FALLBACK_WINDOW[0] - FALLBACK_WINDOW[1]),
        ("", FALLBACK_WINDOW[0] - FALLBACK_WINDOW[1]),
    ],
)
def test_the_default_ceiling_follows_the_models_context_window(model, ceiling):
    assert default_ceiling(model) == ceiling


def test_the_ceiling_in_force_without_one_set_is_the_models(user, settings):
    settings.CTXSUM = {}
    conversation = services.conversation_create(owner=user)
    assert conversation_policy(conversation).max_context_tokens == CEILING
    conversation.model = "gpt-4.1"
    assert conversation_policy(conversation).max_context_tokens == 1_047_576 - 32_768
    # The policy as stored and answered still says that none was set.
    assert conversation_effective_policy(conversation)["max_context_tokens"] is None
    settings.CTXSUM = {"MAX_CONTEXT_TOKENS": 5000}  # a setting replaces the default
    assert conversation_policy(conversation).max_context_tokens == 5000
    conversation.max_context_tokens = 700  # and the conversation's own replaces both
    assert conversation_policy(conversation).max_context_tokens == 700


@pytest.mark.django_db(transaction=True)  # the compaction runs once the append commits
def test_the_ceiling_holds_with_no_worker(user, no_worker):
    conversation = services.conversation_create(owner=user)
    compacted = 0
    for batch in range(8):  # about 30,000 tokens a batch, 240,000 in all
        messages = [sizeable(f"b{batch}m{index}") for index in range(30)]
        appended = services.message_append(conversation=conversation, messages=messages)
        conversation.refresh_from_db()
        assert conversation.context_tokens <= CEILING, (batch, appended.compaction)
        compacted += appended.compaction.compacted
    assert conversation.message_count == 240
    # The tasks the appends queued never ran: every compaction happened in the appending
    # process, once the context passed the ceiling.
    assert queued() and all(result.status == "READY" for result in queued())
    assert compacted >= 2
    reasons = CompactionAttempt.objects.filter(conversation=conversation)
    assert set(reasons.values_list("reason", flat=True)) == {"compacted"}


# --- the admin: compactions queued for more than a minute ---------------------------------


def waiting(user: Any, minutes: float = 5, **fields: Any) -> Conversation:
    """A conversation over its trigger (2,000 tokens) whose last change, which queued a
    compaction task, was ``minutes`` ago."""
    conversation = services.conversation_create(
        owner=user, messages=[sizeable(f"w{index}", 100) for index in range(12)], **fields
    )
    then = timezone.now() - timedelta(minutes=minutes)
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=then)
    conversation.refresh_from_db()
    return conversation


def test_a_compaction_is_queued_while_due_and_neither_running_nor_tried(user, no_worker):
    conversation = waiting(user, trigger={"tokens": 2000})
    assert compaction_due(conversation)
    assert services.compaction_queued_at(conversation, None) == conversation.updated_at
    below = waiting(user, trigger={"tokens": 90_000})
    assert services.compaction_queued_at(below, None) is None  # nothing is due
    fresh = waiting(user, 0.5, trigger={"tokens": 2000})
    assert services.compaction_queued_at(fresh, None) is None  # queued 30 seconds ago
    rows = Conversation.objects.filter(pk=conversation.pk)
    rows.update(lease_owner="worker", leased_at=timezone.now())  # a live lease: running
    conversation.refresh_from_db()
    assert services.compaction_queued_at(conversation, None) is None
    rows.update(leased_at=timezone.now() - timedelta(hours=1))  # abandoned
    conversation.refresh_from_db()
    assert services.compaction_queued_at(conversation, None) == conversation.updated_at
    # A task ran since the last change (and failed, say): nothing is queued any more.
    assert services.compaction_queued_at(conversation, timezone.now()) is None
    settings_off = {"SUMMARIZER": OFFLINE_SUMMARIZER, "AUTO_COMPACT": False}
    with override_settings(CTXSUM=settings_off):  # nothing is ever queued
        assert services.compaction_queued_at(conversation, None) is None


def test_the_admin_shows_compactions_queued_over_a_minute(admin_client, user, no_worker):
    stuck = waiting(user, 5, title="stuck", trigger={"tokens": 2000})
    waiting(user, 0.5, title="fresh", trigger={"tokens": 2000})  # 30 seconds: not yet
    tried = waiting(user, 5, title="tried", trigger={"tokens": 2000})
    CompactionAttempt.objects.create(conversation=tried, outcome="failed")
    html = admin_client.get(reverse("admin:ctxsum_conversation_changelist")).content.decode()
    assert all(f">{title}</a>" in html for title in ("stuck", "fresh", "tried"))
    assert html.count("is a task worker running?") == 1 and ">5\xa0minutes<" in html

    def review(conversation: Conversation) -> str:
        url = reverse("admin:ctxsum_conversation_review", args=[conversation.pk])
        return admin_client.get(url).content.decode()

    assert "was queued 5\xa0minutes ago and has not run" in review(stuck)
    assert "has not run" not in review(Conversation.objects.get(title="fresh"))
    assert "has not run" not in review(tried)
    assert f"the model's default: {CEILING}" in review(tried)


# --- the check: a backend that needs a worker ---------------------------------------------


def worker_warnings(settings: Any, backend: str, **ctxsum: Any) -> list[Any]:
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER, **ctxsum}
    settings.TASKS = BACKENDS[backend]
    return [message for message in run_checks() if message.id == "ctxsum.W008"]


def test_a_backend_that_needs_a_worker_is_a_warning(settings):
    [warning] = worker_warnings(settings, "database")
    assert "DatabaseBackend runs compactions only in a worker" in warning.msg
    assert "Start `manage.py db_worker`" in warning.hint
    # Not when the backend runs the tasks itself, or is the tests' own, or nothing is queued.
    assert worker_warnings(settings, "immediate") == []
    assert worker_warnings(settings, "dummy") == []
    assert worker_warnings(settings, "database", AUTO_COMPACT=False) == []
    assert worker_warnings(settings, "database", COMPACTION_RUNNER="sync") == []
