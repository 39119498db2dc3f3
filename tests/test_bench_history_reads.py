"""bench.history_reads on small targets built from the shipped sample (compacted by the
offline summarizer: they hold key facts): every read answers, and takes the same queries
whatever the history's length."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from bench.common import SUMMARIZERS
from bench.history_reads import READS, SCAN, Same, measure, plans, read_urls
from bench.scaling_measure import Target
from bench.scaling_state import sample_pool, target_build
from ctxsum.facts.models import Fact
from tests.support.shared import FIXTURE_CONVERSATIONS

pytestmark = pytest.mark.django_db
# The rows of the ``…_same`` reads: those of a history of 20 messages and one summary.
SAME = Same(messages=20, summaries=1, facts=5)


@pytest.fixture
def pool(settings):
    settings.CTXSUM = {
        **settings.CTXSUM,
        "SUMMARIZER": SUMMARIZERS["offline"],
        "ENCODING": "o200k_base",
    }
    return sample_pool(FIXTURE_CONVERSATIONS)


def test_every_read_takes_the_same_queries_whatever_the_history(pool, user) -> None:
    built = [
        target_build(pool, owner=user, size=size, compacted=True, batch=40) for size in (20, 200)
    ]
    targets = [Target(str(row.history), row.history, True, row) for row in built]
    client = Client()
    client.force_login(user)

    results = measure(targets, client, SAME, rounds=2, calls=1)

    small, large = (results[target.name] for target in targets)
    assert large.keys() == set(READS)
    assert targets[1].built.summaries > 1
    urls = read_urls(targets[1].built.conversation, SAME)
    assert urls["summaries_last"].endswith("?page=1")
    assert urls["summaries_first_same"].endswith("?page_size=1")
    assert Fact.objects.filter(conversation=built[1].conversation).exists()
    for name in READS:
        assert small[name]["queries"] == large[name]["queries"], name
        assert large[name]["ms"]["n"] == 2


def test_on_postgresql_every_read_has_its_plans(pool, user) -> None:
    """Each read's queries of ctxsum's tables with their EXPLAIN ANALYZE (PostgreSQL only):
    on a small table none reads the messages whole."""
    built = target_build(pool, owner=user, size=200, compacted=True, batch=40)
    client = Client()
    client.force_login(user)

    found = plans([Target("200", 200, True, built)], client, SAME)

    if connection.vendor != "postgresql":
        assert found == {}
        return
    assert found["200"].keys() == set(READS)
    for name, queries in found["200"].items():
        assert queries and all('"ctxsum_' in query["sql"] for query in queries), name
        plan = [line for query in queries for line in query["plan"]]
        assert any("Execution Time" in line for line in plan), name
        assert not any(SCAN in line for line in plan), (name, plan)
