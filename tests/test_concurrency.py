"""Concurrent appends to one conversation, each thread on its own PostgreSQL connection:
gapless seq numbers, every writer's order kept, batches whole, counters exact."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection
from django.db.models import Count, Sum

from ctxsum.models import Conversation, Message
from ctxsum.services import conversation_create, message_append
from tests.factories import assistant_calls, tool_result, user_message

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL row locks; set DATABASE_URL",
    ),
]

THREADS = 8


def run_together(work: Callable[[int], None], threads: int = THREADS) -> None:
    """Run ``work(index)`` in ``threads`` threads released at once by a barrier; re-raise
    the first failure."""
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def target(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            work(index)
        except BaseException as error:  # reported by the main thread
            errors.append(error)
        finally:
            connection.close()

    workers = [threading.Thread(target=target, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert not any(worker.is_alive() for worker in workers), "a writer hung"
    if errors:
        raise errors[0]


def assert_counters_match_rows(conversation: Conversation) -> list[Message]:
    conversation.refresh_from_db()
    rows = list(Message.objects.filter(conversation=conversation).order_by("seq"))
    totals = (
        Message.objects.filter(conversation=conversation)
        .active()
        .aggregate(count=Count("id"), tokens=Sum("token_count"))
    )
    assert [row.seq for row in rows] == list(range(len(rows)))  # no gaps, no duplicates
    assert conversation.next_seq == len(rows)
    assert conversation.message_count == len(rows)
    assert conversation.active_message_count == totals["count"] == len(rows)
    assert conversation.active_tokens == totals["tokens"] == sum(r.token_count for r in rows)
    return rows


def tag(message: Message) -> tuple[int, int]:
    writer, number = message.content.split(":")[1:3]
    return int(writer), int(number)


@pytest.mark.django_db(transaction=True)
def test_concurrent_single_appends(user) -> None:
    per_thread = 50
    conversation = conversation_create(owner=user, title="race")

    def work(index: int) -> None:
        mine = Conversation.objects.get(pk=conversation.pk)
        for number in range(per_thread):
            message_append(
                conversation=mine,
                messages=[user_message(f"msg:{index}:{number}:" + "x" * number)],
            )

    run_together(work)

    rows = assert_counters_match_rows(conversation)
    assert len(rows) == THREADS * per_thread
    by_writer: dict[int, list[int]] = {}
    for row in rows:
        writer, number = tag(row)
        by_writer.setdefault(writer, []).append(number)
    # each writer's messages all arrived, in the order it sent them
    assert by_writer == {index: list(range(per_thread)) for index in range(THREADS)}
    assert conversation.revision == THREADS * per_thread


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_interleave_as_whole_batches(user) -> None:
    batches, batch_size = 6, 7
    conversation = conversation_create(owner=user, system="Count.")

    def work(index: int) -> None:
        mine = Conversation.objects.get(pk=conversation.pk)
        for batch in range(batches):
            rows = message_append(
                conversation=mine,
                messages=[
                    user_message(f"msg:{index}:{batch * batch_size + n}:")
                    for n in range(batch_size)
                ],
            ).messages
            seqs = [row.seq for row in rows]
            assert seqs == list(range(seqs[0], seqs[0] + batch_size))

    run_together(work)

    rows = assert_counters_match_rows(conversation)
    assert len(rows) == 1 + THREADS * batches * batch_size
    assert rows[0].is_leading and rows[0].seq == 0
    appended = rows[1:]
    # Walking the transcript in seq order, each run of batch_size messages is one writer's
    # one batch, its messages in the order sent.
    seen: dict[int, list[int]] = {}
    for start in range(0, len(appended), batch_size):
        chunk = [tag(row) for row in appended[start : start + batch_size]]
        writers = {writer for writer, _ in chunk}
        assert len(writers) == 1, chunk
        numbers = [number for _, number in chunk]
        assert numbers == list(range(numbers[0], numbers[0] + batch_size))
        assert numbers[0] % batch_size == 0
        seen.setdefault(writers.pop(), []).extend(numbers)
    assert seen == {i: list(range(batches * batch_size)) for i in range(THREADS)}


@pytest.mark.django_db(transaction=True)
def test_concurrent_tool_calls_and_results(user) -> None:
    """Each writer's tool result must find its own request, stored by another transaction
    moments before; none is lost or misattributed."""
    rounds = 10
    conversation = conversation_create(owner=user)

    def work(index: int) -> None:
        mine = Conversation.objects.get(pk=conversation.pk)
        for number in range(rounds):
            call_id = f"call_{index}_{number}"
            message_append(conversation=mine, messages=[assistant_calls(call_id, name="f")])
            message_append(conversation=mine, messages=[tool_result(call_id, "ok")])

    run_together(work)
    rows = assert_counters_match_rows(conversation)
    assert len(rows) == THREADS * rounds * 2
    requested_at = {}
    for row in rows:
        if row.tool_calls:
            requested_at[row.tool_calls[0]["id"]] = row.seq
        else:
            assert requested_at[row.tool_call_id] < row.seq
