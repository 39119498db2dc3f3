"""ctxsum.summarizers.facts: splitting a summarizer's answer into its summary and key facts, and
keeping only the facts that can be trusted. Pure: no database."""

from __future__ import annotations

import json

import pytest

from ctxsum.summarizers import facts as fact_parse
from ctxsum.summarizers.facts import MAX_KEY_CHARS, MAX_VALUE_CHARS, ProposedFact

FACT = {"key": "order_id", "value": "AI-101", "source_seqs": [3]}
# JSON nested deeper than Python's parser recurses (it raises RecursionError).
DEEP = "[" * 10_000 + "]" * 10_000


def fact(key: str = "order_id", value: str = "AI-101", *seqs: int) -> ProposedFact:
    return ProposedFact(key=key, value=value, source_seqs=seqs or (3,))


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("Order ID", "order_id"),
        ("order-id", "order_id"),
        ("  ORDER   id ", "order_id"),
        ("e-mail", "e_mail"),
        ("Fecha de entrega", "fecha_de_entrega"),
        ("__x__", "x"),
        ("!!!", ""),
    ],
)
def test_keys_are_normalized_so_a_later_answer_finds_them(raw, key):
    assert fact_parse.normalize_key(raw) == key


def test_a_tagged_answer_is_split_into_summary_and_facts():
    content = f"The user ordered AI-101.\n<facts>{json.dumps([FACT])}</facts>"
    summary, raw, problem = fact_parse.split_tagged(content)
    assert (summary, problem) == ("The user ordered AI-101.", "")
    assert fact_parse.facts_from_text(raw or "").facts == (fact(),)


def test_text_after_the_block_stays_in_the_summary():
    summary, raw, _ = fact_parse.split_tagged("Before.\n<facts>[]</facts>\nAfter.")
    assert summary == "Before.\n\nAfter." and raw == "[]"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("Only a summary.", fact_parse.NO_FACTS_BLOCK),
        ('A summary.\n<facts>[{"key": "a"', fact_parse.UNCLOSED_BLOCK),
    ],
)
def test_an_answer_without_a_whole_block_keeps_its_summary(content, problem):
    summary, raw, found = fact_parse.split_tagged(content)
    assert summary == content.split("<facts>")[0].strip()
    assert raw is None and found == problem


def test_a_block_in_a_code_fence_is_read():
    raw = f"\n```json\n{json.dumps([FACT])}\n```\n"
    assert fact_parse.facts_from_text(raw).facts == (fact(),)


def test_facts_nested_deeper_than_the_parser_goes_are_skipped_with_the_reason():
    assert fact_parse.facts_from_text(DEEP) == fact_parse.Parsed(skipped=(fact_parse.TOO_DEEP,))


def test_bad_json_skips_every_fact_with_the_reason():
    parsed = fact_parse.facts_from_text('[{"key": "order_id", "value": ')
    assert parsed.facts == ()
    assert parsed.skipped[0].startswith("The facts are not valid JSON")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"order_id": "AI-101"}, "not a JSON list of objects but an object"),
        (None, "but null"),
        ("AI-101", "but a str"),
        (["AI-101"], "Fact 1 is not an object."),
        ([{"value": "x", "source_seqs": [1]}], "Fact 1 has no key"),
        ([{"key": "a", "value": "", "source_seqs": [1]}], "Fact 1 (a) has no value"),
        ([{"key": "a", "value": None, "source_seqs": [1]}], "Fact 1 (a) has no value"),
        ([{"key": "a", "value": True, "source_seqs": [1]}], "Fact 1 (a) has no value"),
        ([{"key": "a", "value": "x"}], "Fact 1 (a) has no source_seqs"),
        ([{"key": "a", "value": "x", "source_seqs": "1"}], "has no source_seqs"),
        ([{"key": "a", "value": "x", "source_seqs": [1.5]}], "has no source_seqs"),
        ([{"key": "a", "value": "x", "source_seqs": [True]}], "has no source_seqs"),
        ([{"key": "k" * (MAX_KEY_CHARS + 1), "value": "x", "source_seqs": [1]}], "key is longer"),
        ([{"key": "a", "value": "x" * (MAX_VALUE_CHARS + 1), "source_seqs": [1]}], "value is"),
    ],
)
def test_facts_of_the_wrong_shape_are_dropped_with_the_reason(value, reason):
    parsed = fact_parse.facts_from_json(value)
    assert parsed.facts == ()
    assert len(parsed.skipped) == 1 and reason in parsed.skipped[0], parsed.skipped


@pytest.mark.parametrize("value", ["a\u0000b", "Ana \ud800", "\udfff"])
def test_a_value_the_database_cannot_store_is_dropped_alone(value):
    parsed = fact_parse.facts_from_json([{"key": "note", "value": value, "source_seqs": [1]}, FACT])
    assert parsed.facts == (fact(),)
    assert parsed.skipped == (fact_parse.UNSTORABLE.format(index=1, key="note"),)


def test_a_bad_fact_does_not_cost_the_good_ones():
    parsed = fact_parse.facts_from_json([FACT, {"key": "", "value": "x", "source_seqs": []}])
    assert parsed.facts == (fact(),)
    assert parsed.skipped == ("Fact 2 has no key (a non-empty string).",)


def test_a_number_is_taken_as_written_and_values_go_on_one_line():
    parsed = fact_parse.facts_from_json(
        [
            {"key": "amount", "value": 1200.5, "source_seqs": [2, 1, 2]},
            {"key": "address", "value": "  1 Main St\n  Springfield ", "source_seqs": [4]},
        ]
    )
    assert parsed.facts == (
        ProposedFact(key="amount", value="1200.5", source_seqs=(1, 2)),
        ProposedFact(key="address", value="1 Main St Springfield", source_seqs=(4,)),
    )


def test_a_structured_answer_gives_its_summary_and_facts():
    content = json.dumps({"summary": " The summary. ", "facts": [FACT]})
    summary, parsed = fact_parse.structured_answer(content)
    assert summary == "The summary." and parsed.facts == (fact(),) and parsed.skipped == ()


@pytest.mark.parametrize(
    ("content", "summary", "reason"),
    [
        # A server that ignored response_format: its prose is the summary.
        ("Plain prose.", "Plain prose.", fact_parse.NOT_STRUCTURED),
        (json.dumps({"summary": "S."}), "S.", fact_parse.NO_FACTS_FIELD),
        (json.dumps({"summary": "S.", "facts": "none"}), "S.", "but a str"),
        # Facts deeper than the parser recurses, after a whole summary: the summary stands.
        ('{"summary": "S.", "facts": ' + DEEP + "}", "S.", fact_parse.TOO_DEEP),
        # Not the object asked for: no summary to trust.
        ('{"summary": "S.", "facts": [', None, None),
        (json.dumps({"text": "S."}), None, None),
        (json.dumps({"summary": " "}), None, None),
        (json.dumps(["S."]), None, None),
        ('{"facts": ' + DEEP + ', "summary": "S."}', None, None),
    ],
)
def test_a_structured_answer_that_is_not_what_was_asked(content, summary, reason):
    found, parsed = fact_parse.structured_answer(content)
    assert found == summary
    assert parsed.facts == ()
    if reason is not None:
        assert reason in parsed.skipped[0]


@pytest.mark.parametrize(
    ("content", "summary"),
    [
        ('{"summary": "All of it.", "facts": [{"key": "a", "val', "All of it."),
        ('{"summary": "All of it.", ', "All of it."),
        ('{"summary": "Half of i', None),
        ('{"summary": "All of it."', None),  # nothing says the summary was complete
        ("Not JSON at all", None),
    ],
)
def test_a_structured_answer_cut_off_in_its_facts_keeps_its_summary(content, summary):
    assert fact_parse.salvaged_summary(content) == summary


def test_facts_must_cite_the_messages_summarized():
    parsed = fact_parse.facts_checked(
        [
            fact("inside", "a", 3, 4),
            fact("outside", "b", 3, 99),
            ProposedFact(key="nowhere", value="c", source_seqs=()),
            ProposedFact(key="", value="d", source_seqs=(3,)),
        ],
        allowed_seqs={3, 4, 5},
    )
    assert [f.key for f in parsed.facts] == ["inside"]
    assert parsed.skipped == (
        "Fact outside cites seq 99, outside the messages summarized.",
        "Fact nowhere cites no message.",
        "Fact ? has an empty key or value.",
    )


def test_a_key_given_twice_keeps_the_later_value_or_joins_the_seqs():
    parsed = fact_parse.facts_checked(
        [fact("a", "x", 1), fact("b", "y", 1), fact("a", "x", 2), fact("b", "z", 3)],
        allowed_seqs=range(10),
    )
    assert parsed.facts == (fact("a", "x", 1, 2), fact("b", "z", 3))


def test_at_most_max_facts_are_kept():
    many = [fact(f"k{index}", "v", 1) for index in range(fact_parse.MAX_FACTS + 5)]
    parsed = fact_parse.facts_checked(many, allowed_seqs={1})
    assert len(parsed.facts) == fact_parse.MAX_FACTS
    assert parsed.skipped == (f"5 facts beyond the first {fact_parse.MAX_FACTS} were dropped.",)


def test_reasons_are_kept_once_and_at_most_max_reasons():
    reasons = ["same", "same", *(f"r{index}" for index in range(fact_parse.MAX_REASONS + 3))]
    lines = fact_parse.skipped_text(reasons).splitlines()
    assert lines[0] == "same" and lines.count("same") == 1
    assert len(lines) == fact_parse.MAX_REASONS + 1 and lines[-1] == "… and 4 more."
