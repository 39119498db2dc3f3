"""When the context carries a fact's value (``ctxsum.facts.lines.carries``): the value as a
whole, ignoring case and spacing, and only a value long enough not to be found by chance."""

from __future__ import annotations

import pytest

from ctxsum.facts.lines import MIN_CARRIED_CHARS, carries, normalized


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("Your ticket AI-101 is on its way.", "AI-101"),
        ("your ticket ai-101.", "Ai-101"),
        ("Write to ANA@Example.com today", "ana@example.com"),
        ("a budget of\n400   EUR, no more", "400 EUR"),
        ("(AI-101)", "AI-101"),
        ("price: $1,200", "$1,200"),
    ],
)
def test_a_value_the_text_holds_is_carried(text, value):
    assert carries(normalized(text), value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("Your ticket AI-1012 is on its way.", "AI-101"),  # a longer identifier
        ("ticket XAI-101", "AI-101"),
        ("The hotel in Lisbon", "Lisbon, Portugal"),
        ("12 items, 2012", "12"),  # too short to tell
        ("yes", "yes"),
        ("", "AI-101"),
    ],
)
def test_a_value_the_text_does_not_hold_as_a_whole_is_not_carried(text, value):
    assert not carries(normalized(text), value)


def test_the_shortest_carried_value():
    value = "A" * MIN_CARRIED_CHARS
    assert carries(normalized(f"see {value}."), value)
    assert not carries(normalized(f"see {value[1:]}."), value[1:])
