"""ctxsum on a database of its own: with a router sending its models (and the user model
they point at, since Django has no relations across databases) to ``other``, every service
locks, writes, rolls back and runs its after-commit work there, and ``default`` never sees
a row. A service that opened its transaction on ``default`` fails these tests: its lock
would be taken outside any transaction, its writes would not roll back together, and an
automatic compaction inside a caller's transaction would not wait for it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from ctxsum import selectors, services
from ctxsum.api.idempotency import REPLAYED_HEADER
from ctxsum.models import (
    CompactionAttempt,
    Conversation,
    IdempotencyKey,
    Message,
    Summary,
    ToolCall,
)
from ctxsum.policy import Reason
from ctxsum.services.idempotency import keys_expired_delete
from tests.backends import HookSummarizer
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db(databases=["default", "other"], transaction=True)

POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
MODELS = (Conversation, Message, ToolCall, Summary, CompactionAttempt, IdempotencyKey)


class OtherDatabaseRouter:
    """Everything to ``other``."""

    def db_for_read(self, model, **hints):
        return "other"

    def db_for_write(self, model, **hints):
        return "other"


@pytest.fixture
def routed(settings):
    settings.DATABASE_ROUTERS = [f"{__name__}.OtherDatabaseRouter"]
    settings.CTXSUM = {"SUMMARIZER": "tests.backends.HookSummarizer", "AUTO_COMPACT": False}
    HookSummarizer.during = None
    HookSummarizer.calls = []


@pytest.fixture
def owner(routed):
    return get_user_model().objects.create_user(username="ada", password="pw")


def turns(count: int, start: int = 0) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"turn {i}"} for i in range(start, start + count)]


def rows_on(alias: str) -> dict[str, int]:
    return {model.__name__: model.objects.using(alias).count() for model in MODELS}


def test_every_write_lands_on_the_routed_database(owner):
    conversation = services.conversation_create(
        owner=owner, system="Be brief.", messages=turns(3), **POLICY
    )
    services.message_append(conversation=conversation, messages=turns(4, start=3))
    result = services.conversation_compact(conversation=conversation)
    assert result.compacted, result.reason
    services.conversation_update(conversation=conversation, title="Routed", system="Be kind.")

    assert conversation.title == "Routed"
    assert not any(rows_on("default").values())
    stored = rows_on("other")
    assert stored["Conversation"] == 1 and stored["Summary"] == 1
    assert stored["Message"] == 9  # 1 system + 7 turns + the replacing system message
    context = selectors.context_get(conversation=conversation)
    assert context.summary is not None and context.messages[0]["content"] == "Be kind."

    services.conversation_delete(conversation=conversation)
    assert not any(rows_on("other").values())


def test_a_rejected_create_rolls_back_on_the_routed_database(owner):
    orphan = {"role": "tool", "tool_call_id": "call_nobody_made", "content": "42"}
    with pytest.raises(ValidationError):
        services.conversation_create(owner=owner, title="Never", messages=[*turns(1), orphan])
    # The conversation row was written before the tool result was checked: it must be gone.
    assert Conversation.objects.using("other").count() == 0
    assert Message.objects.using("other").count() == 0


def test_a_failed_compaction_leaves_the_routed_database_as_it_was(owner, settings):
    conversation = services.conversation_create(owner=owner, messages=turns(8), **POLICY)
    before = list(Message.objects.using("other").values_list("seq", "summary_id"))
    settings.CTXSUM = {"SUMMARIZER": "tests.backends.CrashingSummarizer", "AUTO_COMPACT": False}
    with pytest.raises(RuntimeError):
        services.conversation_compact(conversation=conversation)
    assert list(Message.objects.using("other").values_list("seq", "summary_id")) == before
    attempt = CompactionAttempt.objects.using("other").get()
    assert (attempt.outcome, attempt.reason) == ("failed", Reason.ERROR)
    fresh = Conversation.objects.using("other").get()
    assert fresh.lease_owner == "" and fresh.leased_at is None


def test_automatic_compaction_waits_for_the_callers_transaction_on_that_database(
    owner, settings
):
    settings.CTXSUM = {
        "SUMMARIZER": "tests.backends.HookSummarizer",
        "AUTO_COMPACT": True,
        "COMPACTION_RUNNER": "sync",
    }
    conversation = services.conversation_create(owner=owner, messages=turns(2), **POLICY)
    with transaction.atomic(using="other"):
        appended = services.message_append(conversation=conversation, messages=turns(5, 2))
        assert appended.compaction is not None
        assert appended.compaction.reason == Reason.DEFERRED
        assert not HookSummarizer.calls  # no summarizer call while the append's lock is held
    # Committed: the deferred compaction ran and brought the caller's instance up to date.
    assert HookSummarizer.calls
    assert Summary.objects.using("other").filter(conversation=conversation).count() == 1
    assert conversation.active_message_count < 7


def test_idempotency_keys_live_on_the_routed_database(owner):
    conversation = services.conversation_create(owner=owner, messages=turns(8), **POLICY)
    api = APIClient()
    api.force_authenticate(owner)
    url = api_url("message-list", conversation)
    answers = [
        api.post(url, turns(1, start=8)[0], format="json", HTTP_IDEMPOTENCY_KEY="k")
        for _ in range(2)
    ]
    compacted = [
        api.post(api_url("compact", conversation), {}, format="json", HTTP_IDEMPOTENCY_KEY="c")
        for _ in range(2)
    ]

    assert [a.status_code for a in answers] == [201, 201]
    assert answers[1][REPLAYED_HEADER] == "true" and answers[1].content == answers[0].content
    assert compacted[0].json()["compacted"] and compacted[1][REPLAYED_HEADER] == "true"
    assert len(HookSummarizer.calls) == 1
    assert not any(rows_on("default").values())
    stored = rows_on("other")
    assert (stored["Message"], stored["IdempotencyKey"]) == (9, 2)
    # The cleanup looks on the routed database too.
    IdempotencyKey.objects.using("other").update(created_at=timezone.now() - timedelta(days=2))
    assert keys_expired_delete() == 2
    assert not IdempotencyKey.objects.using("other").exists()
