"""Races between compaction, tool results and deletes, on PostgreSQL row locks.

Each worker is a thread with its own database connection, the way separate processes share
one database. The summarizer is the real OpenAI backend talking to a local fake server in
"hold" mode: a call stays in flight until the test calls ``release()``, and a worker waiting
on a row lock is detected with ``pg_blocking_pids``. No sleep decides an outcome.

- a tool result that arrives while its request is being summarized makes the compaction a
  conflict (nothing written), whether it arrives during the call or while the commit waits
  for the row lock; a result for a call kept verbatim does not;
- a result that arrives after the commit, or while the commit holds the lock, is refused
  with an error naming ``tool_call_id``, over the service and over REST;
- appenders of call/result pairs racing two compactors never leave an orphan result;
- a delete racing appends or a held compaction answers 404 / DoesNotExist, never a 500.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from ctxsum.exceptions import MessagesInvalid
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary, ToolCall
from ctxsum.policy import Reason
from ctxsum.selectors import context_get
from ctxsum.services import conversation_create, conversation_delete, message_append
from ctxsum.services.compaction import conversation_compact
from ctxsum.validation import TOOL_CALL_ID_ARCHIVED
from tests.factories import (
    FILLER,
    assistant_calls,
    long_user_message,
    system_message,
    tool_result,
)
from tests.invariants import assert_context_invariants
from tests.openai_server import FakeOpenAI
from tests.postgres import (
    POSTGRES,
    attempts,
    blocked,
    compact_held,
    compact_in_thread,
    held_openai,
    start,
    wait_until,
)
from tests.support.errors import field_codes, field_errors
from tests.support.urls import api_url

pytestmark = POSTGRES
POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}


def result(call_id: str) -> dict[str, Any]:
    return tool_result(call_id, f"{call_id}: found {FILLER}")


def archived_refusal(call_id: str) -> dict[str, list[str]]:
    return {"tool_call_id": [TOOL_CALL_ID_ARCHIVED.format(id=call_id)]}


def rows_left(pk: Any) -> dict[str, int]:
    """Rows of every table that still belong to conversation ``pk``."""
    return {
        model.__name__: model.objects.filter(conversation_id=pk).count()
        for model in (Message, ToolCall, Summary, CompactionAttempt)
    } | {"Conversation": Conversation.objects.filter(pk=pk).count()}


NOTHING_LEFT = dict.fromkeys(("Message", "ToolCall", "Summary", "CompactionAttempt"), 0) | {
    "Conversation": 0
}


@pytest.fixture
def fake(settings, monkeypatch):
    yield from held_openai(settings, monkeypatch, lease_seconds=30)


def create(owner: Any, messages: list[dict[str, Any]], **policy: Any) -> Conversation:
    return conversation_create(owner=owner, messages=messages, **(policy or POLICY))


def assert_untouched(conversation: Conversation, originals: list[dict[str, Any]]) -> None:
    """Nothing was compacted: no summary, every message active, the lease given back."""
    assert not Summary.objects.filter(conversation=conversation).exists()
    assert Message.objects.filter(conversation=conversation).active().count() == len(originals)
    conversation.refresh_from_db()
    assert conversation.lease_owner == "" and conversation.leased_at is None
    assert_context_invariants(conversation, original_messages=originals)


def assert_compacts_again(conversation: Conversation, originals: list[dict[str, Any]]) -> None:
    """A later compaction succeeds, keeping every tool round whole."""
    again = conversation_compact(conversation=conversation, force=True)
    assert again.compacted, again.reason
    assert_context_invariants(conversation, original_messages=originals)


# The orphan scenario: a result arrives while its request is being summarized.

ORPHAN_HISTORY = [
    long_user_message("u0"),
    assistant_calls("call_x"),
    long_user_message("u2"),
    long_user_message("u3"),
    long_user_message("u4"),
]


def test_a_result_for_an_archived_request_arriving_during_the_call_is_a_conflict(user, fake):
    conversation = create(user, ORPHAN_HISTORY)
    worker = compact_held(conversation, fake, force=True)

    # Its request is still active: the result is accepted.
    answer = result("call_x")
    (stored,) = message_append(conversation=conversation, messages=[answer]).messages
    assert stored.seq == len(ORPHAN_HISTORY)

    fake.release()
    outcome = worker.outcome()
    assert [row.seq for row in outcome.archived] == [0, 1, 2], "call_x was not being archived"
    assert outcome.reason == Reason.CONFLICT and not outcome.compacted
    assert outcome.summary is None
    assert attempts(conversation) == [("conflict", "conflict")]
    originals = [*ORPHAN_HISTORY, answer]
    assert_untouched(conversation, originals)

    assert_compacts_again(conversation, originals)
    context = context_get(conversation=conversation).messages
    assert context[-len(originals) + 1 :] == originals[1:], "the tool round was split"


@pytest.mark.parametrize("arriving", ["one", "all"])
def test_parallel_results_for_archived_requests_arriving_during_the_call(user, fake, arriving):
    history = [
        long_user_message("u0"),
        assistant_calls("call_a", "call_b", "call_c"),
        long_user_message("u2"),
        long_user_message("u3"),
        long_user_message("u4"),
    ]
    conversation = create(user, history)
    worker = compact_held(conversation, fake, force=True)

    if arriving == "one":
        during = [result("call_b")]
        message_append(conversation=conversation, messages=during)
    else:
        during = [result("call_a"), result("call_b"), result("call_c")]
        message_append(conversation=conversation, messages=during[:1])
        message_append(conversation=conversation, messages=during[1:])  # one batch

    fake.release()
    outcome = worker.outcome()
    assert 1 in [row.seq for row in outcome.archived]
    assert outcome.reason == Reason.CONFLICT and not outcome.compacted
    assert attempts(conversation) == [("conflict", "conflict")]
    originals = [*history, *during]
    assert_untouched(conversation, originals)

    # The request stayed active: the other results are still accepted.
    later = [result(call_id) for call_id in ("call_a", "call_c")] if arriving == "one" else []
    if later:
        message_append(conversation=conversation, messages=later)
    assert_compacts_again(conversation, [*originals, *later])


def test_a_result_for_a_kept_request_arriving_during_the_call_is_no_conflict(user, fake):
    history = [
        long_user_message("u0"),
        long_user_message("u1"),
        long_user_message("u2"),
        assistant_calls("call_k"),
        long_user_message("u4"),
    ]
    conversation = create(user, history)
    worker = compact_held(conversation, fake, force=True)
    answer = result("call_k")
    message_append(conversation=conversation, messages=[answer])

    fake.release()
    outcome = worker.outcome()
    assert outcome.compacted, outcome.reason
    assert [row.seq for row in outcome.archived] == [0, 1, 2]
    context = context_get(conversation=conversation).messages
    assert context[1:] == [assistant_calls("call_k"), long_user_message("u4"), answer]
    assert_context_invariants(conversation, original_messages=[*history, answer])


# A result arriving after the commit, or while the commit holds the row lock.


def compact_archiving_call_x(user: Any, fake: FakeOpenAI) -> Conversation:
    conversation = create(user, ORPHAN_HISTORY)
    worker = compact_held(conversation, fake, force=True)
    fake.release()
    outcome = worker.outcome()
    assert outcome.compacted, outcome.reason
    assert [row.seq for row in outcome.archived] == [0, 1, 2]
    return conversation


def test_a_result_arriving_after_the_commit_is_refused(user, fake, api):
    conversation = compact_archiving_call_x(user, fake)
    conversation.refresh_from_db()
    before = (conversation.revision, conversation.message_count, conversation.active_tokens)

    with pytest.raises(MessagesInvalid) as refused:
        message_append(conversation=conversation, messages=[result("call_x")])
    assert refused.value.per_message == [archived_refusal("call_x")]
    # All or none: a valid message in the same batch is not stored either.
    with pytest.raises(MessagesInvalid) as refused:
        message_append(
            conversation=conversation, messages=[long_user_message("fine"), result("call_x")]
        )
    assert refused.value.per_message == [{}, archived_refusal("call_x")]

    url = api_url("message-list", conversation)
    response = api.post(url, result("call_x"), format="json")
    assert response.status_code == 400
    assert field_errors(response) == archived_refusal("call_x")
    assert field_codes(response) == {"tool_call_id": ["tool_call_summarized"]}
    response = api.post(
        url, {"messages": [long_user_message("ok"), result("call_x")]}, format="json"
    )
    assert response.status_code == 400
    refusal = archived_refusal("call_x")["tool_call_id"]
    assert field_errors(response) == {"messages.1.tool_call_id": refusal}
    assert field_codes(response) == {"messages.1.tool_call_id": ["tool_call_summarized"]}

    conversation.refresh_from_db()
    after = (conversation.revision, conversation.message_count, conversation.active_tokens)
    assert after == before, "a refused append changed the conversation"
    assert_context_invariants(conversation, original_messages=ORPHAN_HISTORY)


def test_a_result_arriving_while_the_commit_holds_the_lock_waits_and_is_refused(user, fake):
    """The commit has locked the conversation row (it is held inside, on the summary
    table); the append queues on the row lock and, once the commit is done, finds its
    request archived."""
    conversation = create(user, ORPHAN_HISTORY)
    worker = compact_held(conversation, fake, force=True)
    pk = conversation.pk

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {Summary._meta.db_table} IN SHARE MODE")
        fake.release()
        # The commit holds the conversation row and waits to insert the summary.
        assert wait_until(lambda: blocked(worker.pid)), "the commit never waited"
        appender = start(
            lambda: message_append(
                conversation=Conversation.objects.get(pk=pk), messages=[result("call_x")]
            )
        )
        assert wait_until(lambda: blocked(appender.pid)), "the append never waited"
        assert worker.is_alive() and appender.is_alive()

    outcome = worker.outcome()
    assert outcome.compacted, outcome.reason
    with pytest.raises(MessagesInvalid) as refused:
        appender.outcome()
    assert refused.value.per_message == [archived_refusal("call_x")]
    assert_context_invariants(conversation, original_messages=ORPHAN_HISTORY)


def test_a_result_stored_while_the_commit_waits_for_the_lock_is_a_conflict(user, fake):
    """The append holds the conversation row when the compaction comes to commit: the
    commit waits, then sees the result for a request it would archive."""
    conversation = create(user, ORPHAN_HISTORY)
    worker = compact_held(conversation, fake, force=True)
    answer = result("call_x")

    with transaction.atomic():
        Conversation.objects.select_for_update().get(pk=conversation.pk)
        fake.release()
        assert wait_until(lambda: blocked(worker.pid)), "the commit never waited for the lock"
        # Inside the lock: its request is still active, so the result is accepted.
        message_append(conversation=conversation, messages=[answer])
        assert worker.is_alive()

    outcome = worker.outcome()
    assert outcome.reason == Reason.CONFLICT and not outcome.compacted
    assert attempts(conversation) == [("conflict", "conflict")]
    originals = [*ORPHAN_HISTORY, answer]
    assert_untouched(conversation, originals)
    assert_compacts_again(conversation, originals)


# Many appenders of call/result pairs racing two compactors.

APPENDERS = 8
ROUNDS = 6
# Odd appenders wait this long between a call and its result, so that compactions commit
# with calls still pending (their results are then refused); even ones answer at once, so
# that results arrive during a compaction's call (a conflict). Pacing only: every outcome
# is allowed, the invariants decide.
PAUSE = 0.25
COMPACTOR_REASONS = {
    Reason.COMPACTED,
    Reason.IN_PROGRESS,
    Reason.CONFLICT,
    Reason.NOTHING_TO_SUMMARIZE,
    Reason.NO_GAIN,
}


class ToolRoundRace:
    """Appenders sending tool rounds (a call, then its result) while two compactors compact
    the same conversation over and over; what each accepted, refused and answered."""

    def __init__(self, pk: Any) -> None:
        self.pk = pk
        self.lock = threading.Lock()
        self.stored: dict[int, dict[str, Any]] = {}  # seq -> message, for every accepted append
        self.refused: list[str] = []
        self.reasons: list[str] = []
        self.appenders_done = threading.Event()
        self.barrier = threading.Barrier(APPENDERS + 2)

    def append(self, mine: Conversation, message: dict[str, Any]) -> bool:
        try:
            (row,) = message_append(conversation=mine, messages=[message]).messages
        except MessagesInvalid as error:
            call_id = message.get("tool_call_id")
            assert call_id and error.per_message == [archived_refusal(call_id)], error
            with self.lock:
                self.refused.append(call_id)
            return False
        with self.lock:
            self.stored[row.seq] = message
        return True

    def appender(self, index: int) -> None:
        mine = Conversation.objects.get(pk=self.pk)
        self.barrier.wait(timeout=10)
        for number in range(ROUNDS):
            call_id = f"call_{index}_{number}"
            assert self.append(mine, assistant_calls(call_id)), "a tool call was refused"
            if index % 2:
                time.sleep(PAUSE)
            self.append(mine, result(call_id))

    def compactor(self) -> None:
        mine = Conversation.objects.get(pk=self.pk)
        self.barrier.wait(timeout=10)
        while not self.appenders_done.is_set():
            outcome = conversation_compact(conversation=mine, force=True)
            with self.lock:
                self.reasons.append(outcome.reason)

    def run(self) -> None:
        appenders = [start(lambda index=index: self.appender(index)) for index in range(APPENDERS)]
        compactors = [start(self.compactor) for _ in range(2)]
        for worker in appenders:
            worker.outcome(timeout=60)
        self.appenders_done.set()
        for worker in compactors:
            worker.outcome(timeout=60)


def assert_no_orphan_result(conversation: Conversation, refused: list[str]) -> None:
    """A refused result's request is archived; no active result lacks its request."""
    archived_calls = set(
        ToolCall.objects.filter(
            conversation=conversation, message__summary__isnull=False
        ).values_list("call_id", flat=True)
    )
    assert set(refused) <= archived_calls
    context = context_get(conversation=conversation).messages
    requested = {call["id"] for message in context for call in message.get("tool_calls") or ()}
    results = [message["tool_call_id"] for message in context if message["role"] == "tool"]
    assert set(results) <= requested, "an orphan tool result is in the context"


def test_call_result_pairs_racing_two_compactors_leave_no_orphan(user, fake):
    fake.release()  # every summarizer call answers at once
    system = system_message("You book trips.")
    conversation = conversation_create(
        owner=user,
        system=system["content"],
        trigger={"messages": 6},
        keep={"messages": 2},
    )
    race = ToolRoundRace(conversation.pk)
    race.run()

    assert set(race.reasons) <= COMPACTOR_REASONS, sorted(set(race.reasons))
    # Overlapping tool rounds may leave no safe cut; two plain messages end every round.
    closing = [long_user_message("closing 1"), long_user_message("closing 2")]
    for message in closing:
        assert race.append(conversation, message)
    final = conversation_compact(conversation=conversation, force=True)
    assert final.compacted, final.reason
    stored = race.stored
    assert len(stored) + len(race.refused) == APPENDERS * ROUNDS * 2 + len(closing)
    assert sorted(stored) == list(range(1, len(stored) + 1))
    originals = [system, *(stored[seq] for seq in sorted(stored))]
    assert_context_invariants(conversation, original_messages=originals)
    assert_no_orphan_result(conversation, race.refused)
    conversation.refresh_from_db()
    assert conversation.lease_owner == ""


# Deletes racing appends and a held compaction.

DELETE_ROUNDS = 3
DELETE_APPENDERS = 4


def append_until_deleted(user: Any, pk: Any, via: str, first: threading.Event) -> list[str]:
    """Append until the conversation is gone; return what each append answered (201 or
    404). ``first`` is set after the first answer."""
    answers: list[str] = []
    client = APIClient()
    client.force_authenticate(user)
    mine = Conversation.objects.get(pk=pk)
    for number in range(500):
        message = long_user_message(f"m{number}")
        if via == "rest":
            response = client.post(api_url("message-list", pk), message, format="json")
            answers.append(str(response.status_code))
            if response.status_code == 404:
                assert response.json() == {"detail": "No such conversation.", "code": "not_found"}
        else:
            try:
                message_append(conversation=mine, messages=[message])
                answers.append("201")
            except Conversation.DoesNotExist:
                answers.append("404")
        first.set()
        if answers[-1] == "404":
            break
    return answers


@pytest.mark.parametrize("via", ["service", "rest"])
def test_a_delete_racing_appends_answers_404_never_500(user, api, via):
    """Any other exception (an IntegrityError, a 500 the test client re-raises) fails the
    appender that met it."""
    for _ in range(DELETE_ROUNDS):
        conversation = conversation_create(owner=user, **POLICY)
        pk = conversation.pk
        firsts = [threading.Event() for _ in range(DELETE_APPENDERS)]
        appenders = [start(partial(append_until_deleted, user, pk, via, first)) for first in firsts]
        for first in firsts:
            assert first.wait(10), "an appender never got to append"
        if via == "rest":
            assert api.delete(api_url("conversation-detail", pk)).status_code == 204
        else:
            conversation_delete(conversation=conversation)

        for worker in appenders:
            answers = worker.outcome()
            assert answers[-1] == "404", answers[-5:]
            assert set(answers[:-1]) == {"201"}, answers
        assert rows_left(pk) == NOTHING_LEFT


@pytest.mark.parametrize("via", ["service", "rest"])
def test_a_delete_during_a_held_compaction(user, fake, api, via):
    conversation = create(user, ORPHAN_HISTORY)
    pk = conversation.pk

    def compact() -> Any:
        if via == "service":
            return conversation_compact(conversation=Conversation.objects.get(pk=pk), force=True)
        client = APIClient()
        client.force_authenticate(user)
        return client.post(api_url("compact", pk), {"force": True}, format="json")

    worker = start(compact)
    assert fake.wait_for_in_flight(1, timeout=10), "the summarizer call never started"
    if via == "service":
        conversation_delete(conversation=conversation)
    else:
        assert api.delete(api_url("conversation-detail", pk)).status_code == 204
    assert rows_left(pk) == NOTHING_LEFT

    fake.release()
    if via == "service":
        with pytest.raises(Conversation.DoesNotExist):
            worker.outcome()
    else:
        response = worker.outcome()
        assert response.status_code == 404
        assert response.json() == {"detail": "No such conversation.", "code": "not_found"}
    assert rows_left(pk) == NOTHING_LEFT


def test_a_delete_waits_for_a_compaction_commit_in_progress(user, fake):
    """The commit holds the conversation row (held inside, on the summary table): the delete
    queues behind it and then removes the new summary with everything else."""
    conversation = create(user, ORPHAN_HISTORY)
    pk = conversation.pk
    worker = compact_held(conversation, fake, force=True)

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {Summary._meta.db_table} IN SHARE MODE")
        fake.release()
        assert wait_until(lambda: blocked(worker.pid)), "the commit never waited"
        deleter = start(lambda: conversation_delete(conversation=Conversation.objects.get(pk=pk)))
        assert wait_until(lambda: blocked(deleter.pid)), "the delete never waited"

    outcome = worker.outcome()
    assert outcome.compacted, outcome.reason
    deleter.outcome()
    assert rows_left(pk) == NOTHING_LEFT


def test_an_attempt_recorded_while_a_delete_holds_the_row_waits_and_finds_it_gone(user):
    """Recording an attempt locks the conversation row first: behind a delete that holds
    it, the compaction waits, then answers DoesNotExist. Without the lock it would insert an
    attempt for a conversation being deleted, and fail on the foreign key instead."""
    conversation = create(user, [long_user_message("u0"), long_user_message("u1")])
    pk = conversation.pk

    with transaction.atomic():
        Conversation.objects.select_for_update().get(pk=pk)  # what a delete does first
        # Forced with nothing before the kept tail: a skipped attempt is recorded.
        worker = compact_in_thread(conversation, force=True)
        assert wait_until(lambda: blocked(worker.pid)), "the record never waited for the row"
        conversation_delete(conversation=conversation)

    with pytest.raises(Conversation.DoesNotExist):
        worker.outcome()
    assert rows_left(pk) == NOTHING_LEFT


def test_an_auto_compaction_whose_conversation_is_deleted_mid_call(user, fake, api, settings):
    """The append has committed when its automatic compaction starts: it answers 201 and
    reports the compaction as a conflict, never a 500."""
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "sync"}
    conversation = create(user, ORPHAN_HISTORY)  # one short of the trigger
    pk = conversation.pk
    client = APIClient()
    client.force_authenticate(user)
    appender = start(
        lambda: client.post(api_url("message-list", pk), long_user_message("u5"), format="json")
    )
    assert fake.wait_for_in_flight(1, timeout=10), "the automatic compaction never started"
    assert api.delete(api_url("conversation-detail", pk)).status_code == 204

    fake.release()
    response = appender.outcome()
    assert response.status_code == 201
    compaction = response.json()["compaction"]
    assert compaction["compacted"] is False
    assert compaction["reason"] == "conflict"
    assert compaction["detail"] == "The conversation was deleted."
    assert rows_left(pk) == NOTHING_LEFT
