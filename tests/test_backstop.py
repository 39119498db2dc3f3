"""The backstop when no worker runs the compaction tasks: a ceiling in force even with
MAX_CONTEXT_TOKENS unset (the model's context window less its largest reply), which the
appending process enforces at once."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from ctxsum import services
from ctxsum.models import CompactionAttempt
from ctxsum.policy import FALLBACK_WINDOW, default_ceiling
from ctxsum.selectors import conversation_effective_policy, conversation_policy
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
