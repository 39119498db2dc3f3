"""Reads that stay flat whatever the table holds: the active context of a compacted
conversation reads its active rows only, even beside conversations with many active
messages (the case where a planner used to scan the whole conversation), and a transcript
page is a seq range with no OFFSET and no COUNT(*)."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ctxsum import selectors, services
from ctxsum.models import Conversation, Message, Summary
from tests.invariants import assert_context_invariants
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

LONG = 6_000  # messages of each conversation: enough for the planner to weigh its choices
KEEP = 10


def _bulk_conversation(owner, *, compacted: bool) -> Conversation:
    """A conversation of LONG messages written straight to the tables (the services would
    take minutes): a system prompt, then user messages; compacted, all but the last KEEP
    are archived by one summary."""
    conversation = Conversation.objects.create(
        owner=owner,
        next_seq=LONG,
        message_count=LONG,
        active_message_count=KEEP + 1 if compacted else LONG,
    )
    summary = None
    if compacted:
        summary = Summary.objects.create(
            conversation=conversation,
            version=1,
            text="Earlier turns.",
            prompt_version="1",
            prompt_sha256="0" * 64,
            from_seq=1,
            to_seq=LONG - KEEP - 1,
        )
    rows = [
        Message(
            conversation=conversation,
            seq=seq,
            role="system" if seq == 0 else "user",
            is_leading=seq == 0,
            content=f"message {seq}",
            token_count=5,
            summary=summary if summary and 0 < seq < LONG - KEEP else None,
        )
        for seq in range(LONG)
    ]
    Message.objects.bulk_create(rows, batch_size=2_000)
    return conversation


@pytest.fixture
def mixed_table(user):
    """One compacted conversation beside two uncompacted ones of the same length."""
    compacted = _bulk_conversation(user, compacted=True)
    for _ in range(2):
        _bulk_conversation(user, compacted=False)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE ctxsum_message")
    return compacted


def _rows_read(plan: dict) -> int:
    """Rows a PostgreSQL plan read from tables and indexes: what every scan returned plus
    what its filters threw away."""
    read = 0
    if "Scan" in plan["Node Type"]:
        read += plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        read += plan.get("Rows Removed by Index Recheck", 0)
    return read + sum(_rows_read(child) for child in plan.get("Plans", ()))


def _context_sql(conversation: Conversation) -> str:
    """The SQL of the context's read of its messages."""
    with CaptureQueriesContext(connection) as queries:
        selectors.context_get(conversation=conversation)
    assert len(queries) == 3  # the summary, the active messages, the key facts
    return queries.captured_queries[1]["sql"]


def _sqlite_plan_scans_no_conversation(steps: list[str]) -> bool:
    """Every step on the message table searches an index (SEARCH), none reads it through
    (SCAN)."""
    return all(step.startswith("SEARCH") for step in steps if "ctxsum_message" in step)


def test_the_context_reads_the_active_rows_of_a_compacted_conversation(mixed_table):
    context = selectors.context_get(conversation=mixed_table)
    assert [m["content"] for m in context.messages[2:]] == [
        f"message {seq}" for seq in range(LONG - KEEP, LONG)
    ]
    assert context.messages[0] == {"role": "system", "content": "message 0"}
    sql = _context_sql(mixed_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            assert _rows_read(plan[0]["Plan"]) <= 2 * (KEEP + 1), plan
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            steps = [row[-1] for row in cursor.fetchall()]
            # The body by a seq range of an index, the leading message by its own index.
            assert any("seq>?" in step for step in steps), steps
            assert _sqlite_plan_scans_no_conversation(steps), steps


def test_a_system_prompt_replaced_after_the_compaction_still_leads(user, offline_summarizer):
    conversation = services.conversation_create(
        owner=user,
        system="Be brief.",
        messages=[{"role": "user", "content": f"turn {i}"} for i in range(8)],
        trigger={"messages": 6},
        keep={"messages": 2},
    )
    assert services.conversation_compact(conversation=conversation).compacted
    services.conversation_update(conversation=conversation, system="Be terse.")
    services.message_append(conversation=conversation, messages=[{"role": "user", "content": "hi"}])
    context = selectors.context_get(conversation=conversation)
    assert context.messages[0] == {"role": "system", "content": "Be terse."}
    assert [m["content"] for m in context.messages[2:]] == ["turn 6", "turn 7", "hi"]
    assert_context_invariants(conversation)


def test_a_transcript_page_is_a_seq_range(api, mixed_table):
    last_page = LONG // 50
    url = api_url("message-list", mixed_table) + f"?page={last_page}"
    with CaptureQueriesContext(connection) as queries:
        response = api.get(url)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == LONG
    assert [m["seq"] for m in body["results"]] == list(range(LONG - 50, LONG))
    assert body["next"] is None and body["previous"].endswith(f"page={last_page - 1}")
    sql = " ".join(query["sql"].upper() for query in queries.captured_queries)
    assert "OFFSET" not in sql and "COUNT(" not in sql
    page_size = api.get(api_url("message-list", mixed_table) + "?page=3&page_size=7").json()
    assert [m["seq"] for m in page_size["results"]] == list(range(14, 21))
    assert api.get(api_url("message-list", mixed_table) + "?page=999").status_code == 404
