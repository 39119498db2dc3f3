"""The coverage check (ctxsum/coverage.py): what counts as a fact, in the languages of the
real conversations, and when a summary holds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxsum import services
from ctxsum.coverage import coverage, facts_found, message_texts
from ctxsum.models import Summary
from tests.support.shared import FIXTURE_CONVERSATIONS

ROOT = Path(__file__).resolve().parent.parent
COVERAGE_PAGE = ROOT / "docs" / "guide" / "stale-summaries.md"


def kinds(text: str) -> dict[str, str]:
    return {fact: kind for kind, fact in facts_found([text])}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # English
        (
            "Flight AI-101 leaves on October 20 for 2 adults.",
            {"AI-101": "identifier", "October 20": "date"},
        ),
        (
            "Your reservation 8JX2QZ costs $1,200.50 in total.",
            {"8JX2QZ": "identifier", "$1,200.50": "amount"},
        ),
        (
            "Write to help@northwind.example by 2024-05-01.",
            {"help@northwind.example": "email", "2024-05-01": "date"},
        ),
        ("The bag weighs 23 kg, ticket #4521.", {"23": "number", "#4521": "identifier"}),
        ("I met Ana and the team from New York.", {"Ana": "name", "New York": "name"}),
        # Spanish
        (
            "Su reclamo T-1001 vence el 20 de octubre; pague 30 EUR.",
            {"T-1001": "identifier", "20 de octubre": "date", "30 EUR": "amount"},
        ),
        (
            "Llame al 01-800-1234 y pregunte por José Martínez.",
            {"01-800-1234": "identifier", "José Martínez": "name"},
        ),
        # French
        (
            "Le colis 7QK-88 arrive le 3 mars chez Élodie Dupont.",
            {"7QK-88": "identifier", "3 mars": "date", "Élodie Dupont": "name"},
        ),
        # German capitalises every noun: nouns count as names too (a known over-count).
        (
            "Die Rechnung vom 12.03.2024 über 99,90 € ging an Jürgen.",
            {"Rechnung": "name", "12.03.2024": "date", "99,90 €": "amount", "Jürgen": "name"},
        ),
        # Tool call arguments and ids
        (
            '{"order_id": "W2378156", "call": "call_lookup_01"}',
            {"W2378156": "identifier", "call_lookup_01": "identifier"},
        ),
    ],
)
def test_what_counts_as_a_fact(text, expected):
    assert kinds(text) == expected


@pytest.mark.parametrize(
    ("text", "not_a_fact"),
    [
        ("Hello there. Yes, I can.", "Hello"),  # a sentence's first word
        ("Okay, I see. Monday works.", "Monday"),  # weekdays and function words
        ("Yes, I'd like that, and I\u2019ll pay.", "I'd"),  # "I" and its contractions
        ("Yes, I'd like that, and I\u2019ll pay.", "I\u2019ll"),
        ("Room 5 is free.", "5"),  # a lone digit says little
        ("¿Puedo viajar mañana?", "Puedo"),
    ],
)
def test_what_is_not_a_fact(text, not_a_fact):
    assert not_a_fact not in kinds(text)


def test_a_fact_is_found_once_whatever_its_case_or_spacing():
    facts = facts_found(["Meet in New York.", "Then NEW YORK again", "new   york"])
    assert [fact for _, fact in facts].count("New York") == 1


def test_presence_ignores_case_and_how_a_number_is_written():
    covered = ["Refund of $1,200.50 for order W2378156 to Ana in Delhi."]
    result = coverage(covered, "ana (delhi) got 1200.50 back for w2378156.")
    assert result.ratio == 1.0 and not result.missing


@pytest.mark.parametrize(
    ("covered", "summary", "present"),
    [
        ("The fare difference is 84.0 in the tool result.", "It costs 84.00 more.", True),
        ("Refund 912,40 now.", "Refunded 912.4.", True),
        ("It weighs 1.200 kg in total.", "It weighs 1200 kg.", True),  # thousands
        ("Pay 12.50 today.", "Pay 1250 today.", False),  # not the same amount
        ("Room 3.5 please.", "Room 35 please.", False),
    ],
)
def test_numbers_are_compared_by_value(covered, summary, present):
    assert coverage([covered], summary).ratio == (1.0 if present else 0.0)


def test_what_the_summary_lost_is_listed_missing():
    covered = ["Order W2378156 ships to Ana in Delhi on 2024-05-01."]
    result = coverage(covered, "Ana's order ships soon.")
    assert {fact.text for fact in result.missing} == {"W2378156", "Delhi", "2024-05-01"}
    assert result.ratio == pytest.approx(1 / 4)
    assert result.as_json()[0] == {"kind": "identifier", "text": "W2378156", "present": False}


def test_no_facts_means_no_ratio():
    assert coverage(["hi", "ok thanks"], "a greeting").ratio is None


def test_message_texts_read_content_parts_tool_arguments_and_refusals():
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see AB-12"},
                {"type": "image_url", "image_url": {"url": "u"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"id": "ZZ-9"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found ZZ-9"},
        {"role": "assistant", "content": None, "refusal": "Not for QQ-7."},
    ]
    assert message_texts(messages) == ["see AB-12", '{"id": "ZZ-9"}', "found ZZ-9", "Not for QQ-7."]


def test_real_conversations_are_fully_covered_by_their_own_text():
    """A summary that repeats everything misses nothing: on every shipped conversation."""
    for line in FIXTURE_CONVERSATIONS.read_text().splitlines():
        texts = message_texts(json.loads(line)["messages"])
        result = coverage(texts, "\n".join(texts))
        assert result.facts, "a real conversation always has some facts"
        assert result.ratio == 1.0, result.missing[:5]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=80), max_size=5))
def test_any_text_covers_itself(texts):
    result = coverage(texts, "\n".join(texts))
    assert not result.missing


@pytest.mark.django_db
def test_the_documented_figure_is_the_sample_conversations(user, settings):
    """The coverage table of docs/guide/stale-summaries.md is what the check finds on the
    sample conversation."""
    settings.CTXSUM = {"SUMMARIZER": "ctxsum.summarizers.offline.OfflineSummarizer"}
    sample = json.loads((ROOT / "project" / "sample_conversation.json").read_text("utf-8"))
    conversation = services.conversation_create(
        owner=user, messages=sample["messages"], keep={"messages": 4}
    )
    assert services.conversation_compact(conversation=conversation, force=True).compacted
    summary = Summary.objects.get(conversation=conversation, active=True)
    facts = summary.coverage_facts
    rows = []
    for kind in ("identifier", "amount", "date", "number", "name"):
        of_kind = [fact for fact in facts if fact["kind"] == kind]
        missing = ", ".join(fact["text"] for fact in of_kind if not fact["present"])
        rows.append([kind, len(of_kind), sum(fact["present"] for fact in of_kind), missing])
    present = sum(fact["present"] for fact in facts)
    rows.append(["**all**", f"**{len(facts)}**", f"**{present} ({summary.coverage:.0%})**", ""])
    page = COVERAGE_PAGE.read_text(encoding="utf-8")
    lines = {_table_row(line.strip("|").split("|")) for line in page.splitlines()}
    assert all(_table_row(row) in lines for row in rows), rows
    assert (summary.from_seq, summary.to_seq) == (1, 11)


def _table_row(cells: list) -> str:
    """A Markdown table row's cells, spacing and the percent sign's space left out."""
    return "|".join(str(cell).replace(" %", "%").strip() for cell in cells)
