"""What the client is told is what was stored: once a write committed, its answer is a
success with what can still be built, never an error that says it failed.

The database goes away right after the service's commit (every later query fails, as on
a connection killed then), or one read the view makes after it fails: the write is stored,
the answer is 2xx (a stream's last events are ``ctxsum`` and ``[DONE]``), the part that
could not be read is null and logged with the conversation's id, and nothing under /api/
answers 500 or HTML."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connection

import ctxsum.chat.services
import ctxsum.selectors
import ctxsum.services
import ctxsum.services.compaction
import ctxsum.services.rebuild
from ctxsum.chat.models import ChatTurn
from ctxsum.models import Conversation, Message, Summary
from ctxsum.services import conversation_create
from ctxsum.signals import messages_appended
from tests.factories import booked_conversation, long_user_message, user_message
from tests.support.urls import api_url
from tests.test_chat_api import events

pytestmark = pytest.mark.django_db

KILLED = "server closed the connection unexpectedly (the test killed it)"
HISTORY = [long_user_message(f"u{n}") for n in range(6)]


class DatabaseGone:
    """An execute wrapper: once ``armed``, every query fails as on a killed connection,
    before it reaches the database (so the test's own transaction stays usable)."""

    def __init__(self) -> None:
        self.armed = False
        self.refused: list[str] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if self.armed:
            self.refused.append(sql)
            raise OperationalError(KILLED)
        return execute(sql, params, many, context)


@pytest.fixture
def gone() -> Iterator[DatabaseGone]:
    wrapper = DatabaseGone()
    connection.execute_wrappers.append(wrapper)
    yield wrapper
    connection.execute_wrappers.remove(wrapper)


def fail_after(monkeypatch: Any, gone: DatabaseGone, owner: Any, name: str) -> None:
    """Arm ``gone`` as soon as ``owner.name`` (a service as the view calls it) returns."""
    real = getattr(owner, name)

    def committed_then_gone(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        gone.armed = True
        return result

    monkeypatch.setattr(owner, name, committed_then_gone)


def assert_success(response: Any) -> None:
    """2xx, and JSON or an event stream: never a 500, never an HTML page."""
    assert 200 <= response.status_code < 300, getattr(response, "content", b"")[:500]
    assert response["Content-Type"] in ("application/json", "text/event-stream")


def assert_logged(caplog: Any, conversation: Conversation, part: str) -> None:
    records = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert records, "nothing was logged"
    assert any(
        str(conversation.pk) in r.getMessage() and part in r.getMessage() and r.exc_info
        for r in records
    ), [r.getMessage() for r in records]


@pytest.fixture
def chatting(user, chat_model) -> Conversation:
    return conversation_create(owner=user, system="Be brief.", messages=[user_message("Hi")])


# --------------------------------------------------------------------------- the chat turn


@pytest.mark.parametrize("stream", [False, True])
def test_a_stored_turn_is_a_success_when_the_database_goes_after_its_commit(
    api, chatting, chat_model, monkeypatch, gone, caplog, stream
):
    chat_model.reply = "Stored."
    fail_after(monkeypatch, gone, ctxsum.chat.services, "_commit")
    body = {"message": user_message("Question?"), "stream": stream}

    response = api.post(api_url("chat", chatting), body, format="json")

    assert_success(response)
    if stream:
        parsed = events(response)
        assert [name for name, _ in parsed[-2:]] == ["ctxsum", None]
        assert parsed[-1][1] == "[DONE]"
        assert all(name != "error" for name, _ in parsed)
        answer = json.loads(parsed[-2][1])
    else:
        answer = response.json()
    assert gone.refused, "no query was made after the commit: the test proves nothing"
    gone.armed = False
    assert answer["stats"] is None
    assert [m["content"] for m in answer["messages"]] == ["Question?", "Stored."]
    stored = Message.objects.filter(conversation=chatting).order_by("seq")
    assert [m.content for m in stored][-2:] == ["Question?", "Stored."]
    assert ChatTurn.objects.filter(conversation=chatting).count() == 1
    assert_logged(caplog, chatting, "stats")


# --------------------------------------------------------------------------- summaries


@pytest.fixture
def compacted(user, offline_summarizer) -> Conversation:
    return booked_conversation(user)


def active_version(conversation: Conversation) -> int:
    return Summary.objects.get(conversation=conversation, active=True).version


def test_a_revert_applied_is_a_success_when_the_database_goes_after_its_commit(
    api, compacted, monkeypatch, gone, caplog
):
    version = active_version(compacted)
    fail_after(monkeypatch, gone, ctxsum.services, "conversation_revert")

    response = api.post(api_url("summary-revert", compacted, version=version))

    assert_success(response)
    assert gone.refused
    gone.armed = False
    answer = response.json()
    assert answer["reverted"] is True and answer["reverted_version"] == version
    assert answer["context"] is None
    reverted = Summary.objects.get(conversation=compacted, version=version)
    assert reverted.reverted and not reverted.active
    assert_logged(caplog, compacted, "context")


def test_a_rebuild_applied_is_a_success_when_the_database_goes_after_its_commit(
    api, compacted, monkeypatch, gone, caplog
):
    version = active_version(compacted)
    fail_after(monkeypatch, gone, ctxsum.services, "conversation_rebuild")

    response = api.post(api_url("summary-rebuild", compacted))

    assert_success(response)
    assert gone.refused
    gone.armed = False
    answer = response.json()
    assert answer["rebuilt"] is True and answer["context"] is None
    assert active_version(compacted) == answer["summary"]["version"] > version
    assert_logged(caplog, compacted, "context")


def test_a_compaction_applied_is_a_success_when_the_database_goes_after_its_commit(
    api, user, offline_summarizer, monkeypatch, gone, caplog
):
    conversation = conversation_create(
        owner=user, messages=HISTORY, trigger={"messages": 6}, keep={"messages": 2}
    )
    fail_after(monkeypatch, gone, ctxsum.services, "conversation_compact")

    response = api.post(api_url("compact", conversation), {"force": True}, format="json")

    assert_success(response)
    # Its answer is built from what the service returned: nothing left to read, nothing
    # left out.
    assert gone.refused == []
    gone.armed = False
    answer = response.json()
    assert answer["compacted"] is True and answer["context"]["summary"] is not None
    assert Summary.objects.filter(conversation=conversation, active=True).exists()


def test_a_compaction_whose_own_read_after_its_commit_fails_is_a_success(
    api, user, offline_summarizer, monkeypatch, gone, caplog
):
    conversation = conversation_create(
        owner=user, messages=HISTORY, trigger={"messages": 6}, keep={"messages": 2}
    )
    # Inside the service, right after its commit: its own read of the context fails.
    fail_after(monkeypatch, gone, ctxsum.services.compaction, "_commit")

    response = api.post(api_url("compact", conversation), {"force": True}, format="json")

    assert_success(response)
    assert gone.refused
    gone.armed = False
    answer = response.json()
    assert (answer["compacted"], answer["reason"], answer["context"]) == (True, "compacted", None)
    assert Summary.objects.filter(conversation=conversation, active=True).exists()
    assert_logged(caplog, conversation, "context")


def test_a_rebuild_whose_own_read_after_its_commit_fails_is_a_success(
    api, compacted, monkeypatch, gone, caplog
):
    version = active_version(compacted)
    fail_after(monkeypatch, gone, ctxsum.services.rebuild, "_commit")

    response = api.post(api_url("summary-rebuild", compacted))

    assert_success(response)
    gone.armed = False
    answer = response.json()
    assert answer["rebuilt"] is True and answer["context"] is None
    assert active_version(compacted) == answer["summary"]["version"] > version
    assert_logged(caplog, compacted, "rebuilt")


def test_a_redaction_applied_is_a_success_when_the_database_goes_after_its_commit(
    api, compacted, monkeypatch, gone, caplog
):
    archived = Message.objects.filter(conversation=compacted, summary__isnull=False).first()
    assert archived is not None
    fail_after(monkeypatch, gone, ctxsum.services, "message_redact")

    response = api.post(api_url("message-redact", compacted, seq=archived.seq))

    assert_success(response)
    assert gone.refused
    gone.armed = False
    answer = response.json()
    archived.refresh_from_db()
    assert archived.redacted_at is not None
    assert (answer["seq"], answer["content"]) == (archived.seq, archived.content)
    # Archived, by a version that could not be read for the answer.
    assert answer["archived"] is True and answer["summary_version"] is None
    assert_logged(caplog, compacted, "the version that archived it")


# --------------------------------------------------------------------------- one read fails


def fails(*args: Any, **kwargs: Any) -> Any:
    raise DatabaseError(KILLED)


def test_the_turns_stats_failing_leave_them_null(api, chatting, chat_model, monkeypatch, caplog):
    monkeypatch.setattr(ctxsum.selectors, "conversation_stats", fails)

    response = api.post(api_url("chat", chatting), {"message": user_message("Q?")}, format="json")

    assert_success(response)
    assert response.json()["stats"] is None
    assert ChatTurn.objects.filter(conversation=chatting).count() == 1
    assert_logged(caplog, chatting, "stats")


def test_a_reverts_context_failing_leaves_it_null(api, compacted, monkeypatch, caplog):
    version = active_version(compacted)
    monkeypatch.setattr(ctxsum.selectors, "context_get", fails)

    response = api.post(api_url("summary-revert", compacted, version=version))

    assert_success(response)
    answer = response.json()
    assert answer["reverted"] is True and answer["context"] is None
    assert answer["messages_restored"] > 0
    assert Summary.objects.get(conversation=compacted, version=version).reverted
    assert_logged(caplog, compacted, "context")


# --------------------------------------------------------------------------- idempotency


# Without the test's own transaction around it: the key's answer is written in a
# transaction of its own, whose rollback (refused too) would otherwise break the test's.
@pytest.mark.django_db(transaction=True)
def test_a_streamed_turn_whose_keys_answer_cannot_be_stored_still_ends_with_its_answer(
    api, chatting, chat_model, monkeypatch, gone, caplog
):
    """The key was marked applied in the turn's transaction: a retry with it runs nothing,
    whether or not the answer could be stored beside it."""
    fail_after(monkeypatch, gone, ctxsum.chat.services, "_commit")
    url = api_url("chat", chatting)
    body = {"message": user_message("Question?"), "stream": True}

    parsed = events(api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="turn-1"))

    assert [name for name, _ in parsed[-2:]] == ["ctxsum", None]
    gone.armed = False
    assert_logged(caplog, chatting, "Idempotency-Key")
    retry = api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="turn-1")
    assert retry.status_code == 409 and retry["Content-Type"] == "application/json"
    assert ChatTurn.objects.filter(conversation=chatting).count() == 1
    assert len([b for b in chat_model.bodies if b["model"] == "gpt-4o"]) == 1


@pytest.mark.django_db(transaction=True)
def test_an_append_whose_keys_answer_cannot_be_stored_is_answered_all_the_same(
    api, user, monkeypatch, gone, caplog
):
    """A plain request: the decorator stores the answer after the view; a store that fails
    is logged, the append answered, and a retry never appends twice."""
    conversation = conversation_create(owner=user, messages=HISTORY[:1])
    fail_after(monkeypatch, gone, ctxsum.services, "message_append")
    url = api_url("message-list", conversation)
    body = {"messages": [user_message("Once.")]}

    response = api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="append-1")

    assert_success(response)
    assert response.status_code == 201
    gone.armed = False
    records = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("Idempotency-Key claim" in message for message in records), records
    retry = api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="append-1")
    assert retry.status_code == 409 and retry["Content-Type"] == "application/json"
    assert Message.objects.filter(conversation=conversation).count() == 2


# --------------------------------------------------------------------------- after the commit


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stream", [False, True])
def test_a_receiver_failing_once_the_turn_committed_does_not_fail_it(
    api, chatting, chat_model, caplog, stream
):
    """``messages_appended`` is sent once the turn commits (a real commit here, no test
    transaction around it): a receiver that raises is logged, and the turn answered."""

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("a receiver broke")

    messages_appended.connect(broken, dispatch_uid="told-is-stored")
    try:
        body = {"message": user_message("Question?"), "stream": stream}
        response = api.post(api_url("chat", chatting), body, format="json")
        parsed = events(response) if stream else None
    finally:
        messages_appended.disconnect(dispatch_uid="told-is-stored")

    assert_success(response)
    if parsed is not None:
        assert [name for name, _ in parsed[-2:]] == ["ctxsum", None]
        assert all(name != "error" for name, _ in parsed)
    assert ChatTurn.objects.filter(conversation=chatting).count() == 1
    assert_logged(caplog, chatting, "messages_appended")


@pytest.mark.django_db(transaction=True)
def test_a_summary_created_receiver_failing_does_not_fail_the_compaction(
    api, user, offline_summarizer, caplog
):
    """``summary_created`` is sent once the compaction commits (a real commit here): a
    receiver that raises is logged; the compaction is answered as done and recorded once."""
    from ctxsum.models import CompactionAttempt
    from ctxsum.signals import summary_created

    conversation = conversation_create(
        owner=user, messages=HISTORY, trigger={"messages": 6}, keep={"messages": 2}
    )

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("a receiver broke")

    summary_created.connect(broken, dispatch_uid="told-is-stored-summary")
    try:
        response = api.post(api_url("compact", conversation), {"force": True}, format="json")
    finally:
        summary_created.disconnect(dispatch_uid="told-is-stored-summary")

    assert_success(response)
    assert response.json()["compacted"] is True
    attempts = CompactionAttempt.objects.filter(conversation=conversation)
    assert list(attempts.values_list("outcome", flat=True)) == ["compacted"]
    assert any("a receiver broke" in str(r.exc_info) for r in caplog.records if r.exc_info)
