"""bench.facts_recall on the shipped sample: the stored facts keep the identifiers of the
archived messages that the summary alone loses, compaction after compaction."""

from __future__ import annotations

import pytest

from bench.facts_recall import SIDES, Tally, replay
from tests.support.replay_data import iter_records
from tests.support.shared import FIXTURE_CONVERSATIONS


@pytest.mark.django_db
def test_facts_keep_what_the_summary_loses(user, offline_summarizer, settings):
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": False}
    tally = Tally()
    compactions = 0
    records = iter_records(FIXTURE_CONVERSATIONS.parent, (FIXTURE_CONVERSATIONS.name,), limit=4)
    for _, record in records:
        compactions += replay(record, user, tally)
    result = tally.as_json()

    assert compactions >= 10
    assert set(result["all"]) == set(SIDES)
    # A summarizer proposes the ASKED_FACTS latest facts of what it summarizes: most of the
    # identifiers, not all (0.78 on this sample).
    assert result["all"]["summary + facts"] >= 0.75
    assert result["all"]["summary"] < result["all"]["summary + facts"]
    # The block is bounded by FACTS_MAX_TOKENS: it holds at most what the store holds.
    assert result["all"]["summary + facts block"] <= result["all"]["summary + facts"]
    # The block leaves out what the kept messages hold: the context keeps at least as much
    # as the summary and the block alone, and the block's cost is counted per call.
    assert result["all"]["context"] >= result["all"]["summary + facts block"]
    assert result["all"]["context"] >= result["all"]["context without block"]
    cost = result["cost"]
    assert 0 < cost["calls_with_block"] < cost["calls"] and cost["median_block_tokens"] > 0
    for row in result["by_compaction"]:
        assert row["identifiers"] >= max(row["present"].values())
