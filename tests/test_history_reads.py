"""Reads of a compacted conversation that do not grow with its history: the detail (its
stats from the conversation's counters), the context, the transcript's and the summary
list's pages and the facts take the same queries at 20 and at 2,000 messages, none of them
an aggregate or an OFFSET over the messages, summaries or attempts, and on PostgreSQL none
reads more rows than a page holds. The counters the stats read equal a recount after every
kind of write, and the migration that adds them fills them for existing conversations."""

from __future__ import annotations

import importlib
import json
import math
import re
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext

from ctxsum import services, tokens
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.services.summaries import summary_size
from tests.factories import turns
from tests.invariants import assert_context_invariants
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

PAGE = 10
KEEP = 10  # active messages after the archived ones, the system prompt aside
CHUNK = 20  # messages each summary archives
SMALL, LARGE = 20, 2_000
HISTORY_TABLES = ("ctxsum_message", "ctxsum_summary", "ctxsum_compactionattempt")
# The most rows a read of the large history may take from tables and indexes beyond what
# the same read of the small one takes: a page of rows more, each with the row it names.
MORE_ROWS = 2 * PAGE


def _history(owner: Any, size: int) -> Conversation:
    """A conversation of ``size`` messages written with ``bulk_create``: a system prompt,
    then user and assistant turns, all but the last KEEP archived CHUNK at a time by a chain
    of summaries (a compacted attempt each), its counters what the services leave."""
    conversation = Conversation.objects.create(owner=owner, title=f"{size} messages")
    last_archived = size - KEEP - 1
    ends = [*range(CHUNK, last_archived, CHUNK), last_archived]
    summaries: list[Summary] = []
    for version, end in enumerate(ends, start=1):
        text = f"Turns 1 to {end}."
        summaries.append(
            Summary.objects.create(
                conversation=conversation,
                version=version,
                text=text,
                prompt_version="1",
                prompt_sha256="0" * 64,
                model="gpt-4o-mini",
                from_seq=1,
                to_seq=end,
                previous=summaries[-1] if summaries else None,
                token_count=summary_size(text, conversation),
                active=version == len(ends),
            )
        )
    rows = []
    for seq in range(size):
        role = "system" if seq == 0 else ("user", "assistant")[seq % 2]
        message = {"role": role, "content": f"message {seq}"}
        archived = 0 < seq <= last_archived
        rows.append(
            Message(
                conversation=conversation,
                seq=seq,
                is_leading=seq == 0,
                token_count=tokens.count_message(message),
                summary=summaries[(seq - 1) // CHUNK] if archived else None,
                **message,
            )
        )
    Message.objects.bulk_create(rows, batch_size=1_000)
    CompactionAttempt.objects.bulk_create(
        CompactionAttempt(conversation=conversation, outcome="compacted", reason="compacted")
        for _ in summaries
    )
    active = [row for row in rows if row.summary is None]
    archived_rows = [row for row in rows if row.summary is not None]
    Conversation.objects.filter(pk=conversation.pk).update(
        next_seq=size,
        message_count=size,
        active_message_count=len(active),
        active_tokens=sum(row.token_count for row in active) + summaries[-1].token_count,
        archived_message_count=len(archived_rows),
        archived_tokens=sum(row.token_count for row in archived_rows),
        summary_count=len(summaries),
        compaction_count=len(summaries),
    )
    conversation.refresh_from_db()
    return conversation


@pytest.fixture
def histories(user) -> tuple[Conversation, Conversation]:
    """The small and the large history, beside a never compacted conversation of LARGE
    messages, as in a table that holds other conversations (the planner weighs its choices
    by what the whole table holds)."""
    if connection.vendor == "postgresql":
        # New, empty files for the history's tables, until the test's rollback: the rows
        # earlier tests rolled back stay in the old ones as dead tuples, and with no
        # autovacuum the planner prices an index by pages that are mostly dead rows.
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(HISTORY_TABLES)} CASCADE")
    small, large = _history(user, SMALL), _history(user, LARGE)
    other = Conversation.objects.create(owner=user, message_count=LARGE, next_seq=LARGE)
    rows = (
        Message(conversation=other, seq=seq, role="user", content="hi", token_count=8)
        for seq in range(LARGE)
    )
    Message.objects.bulk_create(rows, batch_size=1_000)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return small, large


def _reads(conversation: Conversation) -> dict[str, str]:
    """Every GET of the conversation, its pages of PAGE rows, the last ones included."""
    size, versions = conversation.message_count, conversation.summary_count
    transcript = api_url("message-list", conversation) + f"?page_size={PAGE}"
    summaries = api_url("summary-list", conversation) + f"?page_size={PAGE}"
    return {
        "detail": api_url("conversation-detail", conversation),
        "context": api_url("context", conversation),
        "transcript, first page": transcript,
        "transcript, last page": f"{transcript}&page={math.ceil(size / PAGE)}",
        "summaries, first page": summaries,
        "summaries, last page": f"{summaries}&page={math.ceil(versions / PAGE)}",
        "facts": api_url("fact-list", conversation) + f"?page_size={PAGE}",
    }


def _queries(api: Any, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = api.get(url)
    assert response.status_code == 200, (url, response.content[:300])
    return [query["sql"] for query in captured.captured_queries]


def _on_history(sql: str) -> bool:
    return any(f'FROM "{table}"' in sql for table in HISTORY_TABLES)


def test_every_read_takes_the_same_queries_at_20_and_2000_messages(api, histories) -> None:
    small, large = histories
    for (name, small_url), large_url in zip(
        _reads(small).items(), _reads(large).values(), strict=True
    ):
        few, many = _queries(api, small_url), _queries(api, large_url)
        assert len(few) == len(many), (name, few, many)
        grows = [sql for sql in many if _on_history(sql) and re.search(r"COUNT\(|SUM\(", sql)]
        grows += [sql for sql in many if " OFFSET " in sql]
        assert not grows, (name, grows)


def test_a_page_of_rows_is_read_with_a_limit(api, histories) -> None:
    """A page's seq (version) range holds a page at most; its query says so with a LIMIT,
    or PostgreSQL's planner, guessing thousands of rows, may scan the whole table."""
    _, large = histories
    for name in ("transcript, first page", "transcript, last page", "summaries, first page"):
        pages = [
            sql
            for sql in _queries(api, _reads(large)[name])
            if re.search(r'FROM "ctxsum_(message|summary)".*"(seq|version)" >= ', sql)
        ]
        assert pages and all(f"LIMIT {PAGE}" in sql for sql in pages), (name, pages)


def _plan_reads(plan: dict[str, Any]) -> tuple[int, list[str]]:
    """Rows a PostgreSQL plan read from tables and indexes (what each scan returned, over
    all its loops, plus what its filters threw away), and its sequential scans of the
    history's tables."""
    read, whole = 0, []
    if "Scan" in plan["Node Type"] and plan["Node Type"] != "Bitmap Index Scan":  # its heap's
        kept = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        read += (kept + plan.get("Rows Removed by Index Recheck", 0)) * plan["Actual Loops"]
        if plan["Node Type"] == "Seq Scan" and plan["Relation Name"] in HISTORY_TABLES:
            whole.append(plan["Relation Name"])
    for child in plan.get("Plans", ()):
        child_read, child_whole = _plan_reads(child)
        read, whole = read + child_read, whole + child_whole
    return read, whole


def _explained(sql: str) -> dict[str, Any]:
    """The plan PostgreSQL runs ``sql`` with, as it would choose on a large table: on a
    table of a few pages it may read a whole index or table rather than look rows up,
    which says nothing of how the query grows, so that is ruled out here."""
    settings = ("enable_seqscan", "enable_hashjoin", "enable_mergejoin")
    with connection.cursor() as cursor:
        try:
            for setting in settings:
                cursor.execute(f"SET {setting} = off")
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
            plan = cursor.fetchone()[0]
        finally:
            for setting in settings:
                cursor.execute(f"RESET {setting}")
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return dict(plan[0]["Plan"])


@pytest.mark.skipif(connection.vendor != "postgresql", reason="EXPLAIN ANALYZE: PostgreSQL")
def test_no_read_scans_the_archived_history_on_postgresql(api, histories) -> None:
    small, large = histories
    for (name, small_url), large_url in zip(
        _reads(small).items(), _reads(large).values(), strict=True
    ):
        for few, many in zip(_queries(api, small_url), _queries(api, large_url), strict=True):
            if not many.lstrip().upper().startswith(("SELECT", "(SELECT", "WITH")):
                continue
            read_few, _ = _plan_reads(_explained(few))
            read_many, whole = _plan_reads(_explained(many))
            assert not whole, (name, many, whole)
            # At most a page of rows more, and the row each names: 100 summaries and
            # 1,989 archived messages against 1 and 9.
            assert read_many <= read_few + MORE_ROWS, (name, many, read_few, read_many)


def _index_names(plan: dict[str, Any]) -> set[str]:
    names = {plan["Index Name"]} if "Index Name" in plan else set()
    return names.union(*(_index_names(child) for child in plan.get("Plans", ())))


def test_the_active_summary_is_read_without_sorting_the_versions(api, histories) -> None:
    """At most one summary is active (a partial unique index): its read has no ORDER BY,
    which would let PostgreSQL walk every version in order instead of that index."""
    _small, large = histories
    reads = [
        sql
        for url in _reads(large).values()
        for sql in _queries(api, url)
        if 'FROM "ctxsum_summary"' in sql
        and '"ctxsum_summary"."active"' in sql.partition(" WHERE ")[2]
    ]
    assert reads
    for sql in reads:
        assert " ORDER BY " not in sql, sql
        if connection.vendor == "postgresql":
            assert "ctxsum_summary_one_active" in _index_names(_explained(sql)), sql


def test_a_summary_page_is_the_versions_of_an_offset_page(api, histories) -> None:
    _small, large = histories
    newest_first = list(
        Summary.objects.filter(conversation=large).values_list("version", flat=True)
    )
    url = api_url("summary-list", large)
    for size, page in ((PAGE, 1), (PAGE, 10), (30, 4), (7, 15), (500, 1)):
        body = api.get(f"{url}?page_size={size}&page={page}").json()
        assert body["count"] == len(newest_first) == 100
        expected = newest_first[(page - 1) * size : page * size]
        assert [summary["version"] for summary in body["results"]] == expected
        assert (body["next"] is None) == (page * size >= len(newest_first))
    assert api.get(f"{url}?page_size=30&page=5").status_code == 404
    empty = services.conversation_create(owner=large.owner, messages=turns(3))
    body = api.get(api_url("summary-list", empty)).json()
    assert body == {"count": 0, "next": None, "previous": None, "results": []}


def _recounted_stats(conversation: Conversation) -> dict[str, int]:
    """The stats as counted from the rows."""
    archived = Message.objects.filter(conversation=conversation).archived()
    summaries = Summary.objects.filter(conversation=conversation)
    active = summaries.filter(active=True).values_list("token_count", flat=True).first()
    archived_tokens = archived.aggregate(total=Sum("token_count"))["total"] or 0
    compacted = CompactionAttempt.objects.filter(conversation=conversation, outcome="compacted")
    return {
        "archived_message_count": archived.count(),
        "summary_count": summaries.count(),
        "compaction_count": compacted.count(),
        "tokens_saved": max(0, archived_tokens - (active or 0)),
    }


def _assert_counted(api: Any, conversation: Conversation) -> None:
    assert_context_invariants(conversation)  # the counters against a recount, among others
    stats = api.get(api_url("conversation-detail", conversation)).json()["stats"]
    recounted = _recounted_stats(conversation)
    assert {key: stats[key] for key in recounted} == recounted


def test_the_stats_follow_every_kind_of_write(api, user, offline_summarizer) -> None:
    conversation = services.conversation_create(
        owner=user,
        system="Be brief.",
        messages=turns(8),
        trigger={"messages": 6},
        keep={"messages": 2},
    )
    _assert_counted(api, conversation)
    steps = [
        lambda: services.conversation_compact(conversation=conversation, force=True),
        lambda: services.message_append(conversation=conversation, messages=turns(4)),
        lambda: services.conversation_compact(conversation=conversation, force=True),
        lambda: services.message_redact(conversation=conversation, seq=2),  # archived
        lambda: services.conversation_rebuild(conversation=conversation),
        lambda: services.message_redact(conversation=conversation, seq=12),  # active
        lambda: services.conversation_update(conversation=conversation, system="Be terse."),
        lambda: services.conversation_revert(conversation=conversation, version=3),
        lambda: services.message_redact(conversation=conversation, seq=6),
        lambda: services.message_append(conversation=conversation, messages=turns(4)),
        lambda: services.conversation_compact(conversation=conversation, force=True),
        lambda: services.conversation_revert(conversation=conversation, version=4),
        lambda: services.conversation_revert(conversation=conversation, version=2),
        lambda: services.conversation_revert(conversation=conversation, version=1),
    ]
    for step in steps:
        step()
        _assert_counted(api, conversation)
    conversation.refresh_from_db()
    assert conversation.summary_count == 4 and conversation.compaction_count == 4
    assert conversation.archived_message_count == 0 and conversation.archived_tokens == 0


def test_the_migration_fills_the_counters_of_existing_conversations(
    user, offline_summarizer
) -> None:
    conversation = services.conversation_create(
        owner=user, system="Be brief.", messages=turns(12), keep={"messages": 2}
    )
    services.conversation_compact(conversation=conversation, force=True)
    services.message_append(conversation=conversation, messages=turns(6))
    services.conversation_compact(conversation=conversation, force=True)
    untouched = services.conversation_create(owner=user, messages=turns(3))
    names = ("archived_message_count", "archived_tokens", "summary_count", "compaction_count")
    counted = {
        row.pk: [getattr(row, name) for name in names]
        for row in Conversation.objects.filter(pk__in=[conversation.pk, untouched.pk])
    }
    assert counted[conversation.pk][0] > 0 and counted[conversation.pk][2:] == [2, 2]
    Conversation.objects.update(**dict.fromkeys(names, 0))

    migration = importlib.import_module("ctxsum.migrations.0012_conversation_history_counters")
    migration.fill(apps, SimpleNamespace(connection=connection))

    for pk, values in counted.items():
        row = Conversation.objects.get(pk=pk)
        assert [getattr(row, name) for name in names] == values
