"""bench.vs_langgraph's measurement, tiny, on PostgreSQL: two short histories from the
shipped sample, one round of 6 turns a side after 6 untimed ones. Both sides make their
turns; ctxsum's compaction runs on the worker after every 2nd turn and LangGraph's
middleware summarizes in every 3rd, as the policy (trigger 12 messages, keep 6) says; and
the rows each turn wrote, read back from the write-ahead log, are each side's own. Skipped
on SQLite, and without LangGraph's PostgreSQL checkpointer (the ``bench`` extra)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.postgres")

from django.db import connection
from psycopg.conninfo import make_conninfo

from bench.common import FIXED_SUMMARIZER
from bench.scaling_state import sample_pool
from bench.turn_report import tables
from bench.turn_sides import LANGGRAPH_TABLES, langgraph_drop
from bench.vs_langgraph import parse_args, run
from tests.support.shared import FIXTURE_CONVERSATIONS

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="LangGraph's PostgresSaver and the WAL read back: PostgreSQL; set DATABASE_URL",
    ),
    # Committed for real: the compaction task is enqueued when an append commits.
    pytest.mark.django_db(transaction=True),
]
DATABASE_TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
SIZES = (30, 80)
# After 6 untimed turns, turns 7 to 12: ctxsum compacts after every 2nd, LangGraph in
# every 3rd.
CTXSUM_COMPACTIONS = [8, 10, 12]
LANGGRAPH_COMPACTIONS = [9, 12]


def database_url() -> str:
    """The test database, for LangGraph's own connection."""
    params = connection.settings_dict
    return make_conninfo(
        dbname=params["NAME"],
        host=params["HOST"] or "",
        port=str(params["PORT"] or ""),
        user=params["USER"] or "",
        password=params["PASSWORD"] or "",
    )


@pytest.fixture
def report(settings) -> Any:
    settings.CTXSUM = {
        **settings.CTXSUM,
        "SUMMARIZER": FIXED_SUMMARIZER,
        "ENCODING": "o200k_base",
        "AUTO_COMPACT": True,
        "COMPACTION_RUNNER": "tasks",
    }
    settings.TASKS = DATABASE_TASKS
    pool = sample_pool(FIXTURE_CONVERSATIONS)
    sizes = [str(size) for size in SIZES]
    args = parse_args(["--sizes", *sizes, "--rounds", "1", "--turns", "6", "--warm-up", "6"])
    url = database_url()
    try:
        yield run(args, url, pool.system, pool.runs)
    finally:
        langgraph_drop(url)


def test_one_turn_on_each_side(report) -> None:
    """One measurement, four checks (each run of it takes seconds)."""
    both_sides_turn_and_compact_when_the_policy_says(report)
    each_turn_writes_its_own_sides_rows(report)
    nothing_is_written_between_the_turns_but_the_checks_made_due(report)
    the_tables_show_every_size(report)


def both_sides_turn_and_compact_when_the_policy_says(report: Any) -> None:
    assert [row["size"] for row in report["results"]] == list(SIZES)
    for row in report["results"]:
        ctxsum, langgraph = row["sides"]["ctxsum"], row["sides"]["LangGraph"]
        assert row["history_built"]["ctxsum"] >= row["size"]
        assert row["history_built"]["LangGraph"] >= row["size"] - 1
        assert ctxsum["turns"] == langgraph["turns"] == 6
        assert ctxsum["turn"]["wall_us"]["n"] == langgraph["turn"]["wall_us"]["n"] == 6
        assert ctxsum["compaction_turns"] == CTXSUM_COMPACTIONS
        assert langgraph["compaction_turns"] == LANGGRAPH_COMPACTIONS
        # Each compaction task compacted, and its check, run after it, found nothing due.
        assert ctxsum["task_outcomes"] == {
            "SUCCESSFUL:compacted": 3,
            "SUCCESSFUL:below_trigger": 3,
        }
        # 3 compactions in the untimed turns, 3 in the timed ones; each turn 2 messages.
        summaries = row["ctxsum_summaries"]
        assert summaries["after"] == summaries["built"] + 6
        assert row["ctxsum_messages_after"] == row["history_built"]["ctxsum"] + 2 * 12
        assert ctxsum["background"]["total_cpu_us"]["n"] == 3
        assert langgraph["background"]["total_cpu_us"]["n"] == 0
        turn_mean = ctxsum["turn"]["total_cpu_us"]["mean"]
        assert ctxsum["amortized"]["total_cpu_us"] > turn_mean > 0
        assert set(row["ratios"]) == {"turn_median", "amortized"}


def each_turn_writes_its_own_sides_rows(report: Any) -> None:
    if not report["wal_read"]:
        return  # pg_walinspect is not available on this server: nothing was read
    for row in report["results"]:
        ctxsum, langgraph = row["sides"]["ctxsum"], row["sides"]["LangGraph"]
        # Each append: the conversation's counters updated and the message inserted; the
        # append that reaches the trigger inserts the task row too.
        assert ctxsum["turn_without_compaction"]["rows"]["median"] == 4
        assert ctxsum["turn_with_compaction"]["rows"]["median"] == 5
        assert ctxsum["background"]["rows"]["median"] > 0
        assert langgraph["turn"]["rows"]["median"] > 0
        assert langgraph["turn"]["wal_bytes"]["median"] > 0
        ctxsum_tables = set(ctxsum["by_table"]) - {"(commit)"}
        langgraph_tables = set(langgraph["by_table"]) - {"(commit)"}
        assert "ctxsum_message" in ctxsum_tables
        assert langgraph_tables and langgraph_tables <= set(LANGGRAPH_TABLES)
        assert not ctxsum_tables & set(LANGGRAPH_TABLES)


def nothing_is_written_between_the_turns_but_the_checks_made_due(report: Any) -> None:
    """Between the timed stretches, the WAL holds only the untimed update that makes each
    compaction's check due: neither side left anything to write after its turn."""
    if not report["wal_read"]:
        return
    between = report["wal_between_turns"]
    compactions = sum(row["sides"]["ctxsum"]["compactions"] for row in report["results"])
    assert between["rows"] == compactions == 3 * len(SIZES)
    assert set(between["by_table"]) - {"(commit)"} <= {"django_tasks_database_dbtaskresult"}


def the_tables_show_every_size(report: Any) -> None:
    lines = "\n".join(tables(report))
    for size in SIZES:
        assert f"| {size} | ctxsum |" in lines and f"| {size} | LangGraph |" in lines
