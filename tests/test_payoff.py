"""A compaction that would not pay is not made (REQUIRE_PAYOFF, ``policy.Payoff``), and a
compaction lands at TARGET_RATIO of the trigger (LANDING "target"): ctxsum's defaults, which
these tests run with (the rest of the suite compacts whenever due: tests/settings.py)."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks

from ctxsum.layout import LEADING, ContextLayout, Part
from ctxsum.models import CompactionAttempt, Summary
from ctxsum.policy import PAYBACK_CALLS, Reason, Sizing, parse_policy, plan_compaction
from ctxsum.selectors import context_get
from ctxsum.services import conversation_compact, conversation_create
from tests.factories import OFFLINE_SUMMARIZER, turns

pytestmark = [pytest.mark.django_db, pytest.mark.ctxsum_defaults]

# Short turns, as in a chat: a summary and its summarizer call cost more than they save.
SHORT = "turn {i}: fine, thanks."
# Long turns, as tool results are: archiving them saves far more than the call costs.
LONG = "turn {i}: " + "the itinerary lists Lisbon, Porto and Faro with prices and times. " * 40


@pytest.fixture(autouse=True)
def _offline(settings):
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}


def chat(user, text: str, count: int = 14, **fields):
    return conversation_create(
        owner=user,
        system="You are a travel assistant.",
        messages=turns(count, text),
        trigger={"messages": 12},
        keep={"messages": 6},
        **fields,
    )


def test_a_compaction_that_would_not_pay_is_skipped_and_recorded(user):
    conversation = chat(user, SHORT)
    before = context_get(conversation=conversation)

    result = conversation_compact(conversation=conversation)

    assert not result.compacted and result.reason is Reason.NO_PAYOFF and result.over_trigger
    payoff = result.plan.payoff
    assert payoff is not None and payoff.saved * PAYBACK_CALLS < payoff.cost
    attempt = CompactionAttempt.objects.get(conversation=conversation)
    assert (attempt.outcome, attempt.reason) == ("skipped", "no_payoff")
    assert attempt.tokens_before == before.token_count
    # Nothing changed: no summary, every message still in the context.
    assert not Summary.objects.filter(conversation=conversation).exists()
    assert context_get(conversation=conversation).messages == before.messages


def test_a_compaction_that_pays_is_made(user):
    conversation = chat(user, LONG)

    result = conversation_compact(conversation=conversation)

    assert result.compacted
    payoff = result.plan.payoff
    assert payoff is not None and payoff.saved * PAYBACK_CALLS >= payoff.cost


@pytest.mark.parametrize(
    ("settings_given", "fields", "force"),
    [
        pytest.param({}, {}, True, id="forced"),
        pytest.param({}, {"max_context_tokens": 150}, False, id="over the ceiling"),
        pytest.param({"REQUIRE_PAYOFF": False}, {}, False, id="REQUIRE_PAYOFF off"),
    ],
)
def test_a_compaction_that_would_not_pay_is_made_when(
    user, settings, settings_given, fields, force
):
    settings.CTXSUM = {**settings.CTXSUM, **settings_given}
    conversation = chat(user, SHORT, **fields)
    assert context_get(conversation=conversation).token_count > 150

    result = conversation_compact(conversation=conversation, force=force)

    assert result.compacted and result.plan.payoff is None


def test_the_estimate_counts_the_summarizer_call_and_the_facts_it_brings() -> None:
    policy = parse_policy({"messages": 12}, {"messages": 6})
    layout = ContextLayout(
        pinned=(Part(LEADING, 10),), body_seqs=tuple(range(1, 15)), body_tokens=(100,) * 14
    )
    body = turns(14)
    cheap = plan_compaction(layout, body, policy=policy, sizing=Sizing(prompt_tokens=0))
    assert cheap.compacts and cheap.payoff is not None
    # The summarizer reads the archived messages (100 tokens each) and writes a first
    # summary at its budget, half of them.
    archived = 100 * (14 - cheap.kept)
    assert cheap.payoff.cost == archived + cheap.summary_budget == archived * 3 // 2
    assert cheap.payoff.saved == cheap.tokens_before - cheap.tokens_after
    # The same compaction with a costly instruction, then with facts that grow the block.
    costly = plan_compaction(layout, body, policy=policy, sizing=Sizing(prompt_tokens=2000))
    assert costly.reason is Reason.NO_PAYOFF and costly.payoff.cost == cheap.payoff.cost + 2000
    grown = plan_compaction(
        layout, body, policy=policy, sizing=Sizing(prompt_tokens=0, blocks_growth=300)
    )
    assert grown.payoff.saved == cheap.payoff.saved - 300
    assert grown.reason is Reason.NO_PAYOFF


def test_a_compaction_lands_at_the_target_ratio_keeping_fewer_than_keep(user):
    conversation = conversation_create(
        owner=user,
        system="You are a travel assistant.",
        messages=turns(30, LONG),
        trigger={"tokens": 8000},
        keep={"messages": 10},
    )
    result = conversation_compact(conversation=conversation)

    assert result.compacted and result.plan.kept < 10
    assert result.context.token_count <= 8000 * 0.5


def test_payoff_and_landing_settings_are_checked(settings):
    settings.CTXSUM = {"REQUIRE_PAYOFF": "yes", "LANDING": "middle"}
    errors = [error.msg for error in run_checks() if error.id == "ctxsum.E009"]
    assert "CTXSUM['REQUIRE_PAYOFF'] must be True or False." in errors
    assert "CTXSUM['LANDING'] must be one of 'target', 'keep', not 'middle'." in errors
