"""The coverage check a compaction stores is of what its summarizer was given: the facts the
previous summary held, then those of the newly archived messages. A fact an earlier summary
lost is not looked for again unless a message mentions it anew, so the stored check stays
the size of one summary and one batch however many compactions came before."""

from __future__ import annotations

import pytest

from ctxsum import services
from ctxsum.models import Summary

pytestmark = pytest.mark.django_db


def batch(number: int, extra: str = "") -> list[dict[str, str]]:
    """Two messages with facts of their own (two orders and an invoice of ``number``), a
    name every batch repeats, and ``extra``; then two without facts (the kept tail)."""
    return [
        {
            "role": "user",
            "content": f"Please ship ORD-{number}-A to Alice Novak, ORD-{number}-B too. {extra}",
        },
        {"role": "assistant", "content": f"Done, invoice INV-{number}-7 is attached."},
        {"role": "user", "content": "anything else?"},
        {"role": "assistant", "content": "no, that is all."},
    ]


@pytest.fixture
def conversation(user, openai_summarizer):
    return services.conversation_create(owner=user, keep={"messages": 2})


def compact(conversation, server, messages, reply: str) -> Summary:
    """Append ``messages``, then compact with the summarizer answering ``reply``."""
    services.message_append(conversation=conversation, messages=messages)
    server.reply = reply
    result = services.conversation_compact(conversation=conversation, force=True)
    assert result.compacted, result.reason
    return Summary.objects.get(pk=result.summary.pk)


def checked(summary: Summary) -> dict[str, bool]:
    return {fact["text"]: fact["present"] for fact in summary.coverage_facts}


def test_the_stored_check_does_not_grow_with_the_compactions(conversation, openai_server):
    """Fifty compactions, each archiving new facts, each summary keeping the newest two
    orders: every check from the third on holds the same number of facts."""
    counts = []
    for number in range(1, 51):
        reply = f"Ship ORD-{number - 1}-A and ORD-{number}-A."
        summary = compact(conversation, openai_server, batch(number), reply)
        counts.append(len(summary.coverage_facts))

    assert set(counts[2:]) == {counts[2]}, counts
    assert checked(summary) == {
        # What the summary so far held, in its order: one kept, one dropped now.
        "ORD-48-A": False,
        "ORD-49-A": True,
        # The newly archived messages' (the messages kept last time, then the new ones).
        "ORD-50-A": True,
        "Alice Novak": False,
        "ORD-50-B": False,
        "INV-50-7": False,
    }
    assert summary.coverage == 2 / 6
    assert summary.version == 50


def test_a_fact_lost_is_not_looked_for_until_a_message_mentions_it_again(
    conversation, openai_server
):
    first = compact(conversation, openai_server, batch(1, "Ticket TKT-77."), "Ship ORD-1-A.")
    second = compact(conversation, openai_server, batch(2), "Ship ORD-2-A.")
    third = compact(
        conversation, openai_server, batch(3, "Ticket TKT-77 again."), "TKT-77 and ORD-3-A."
    )

    assert checked(first)["TKT-77"] is False  # given, and lost
    assert "TKT-77" not in checked(second)  # not given: the summary so far had lost it
    assert checked(third)["TKT-77"] is True  # given again by a message, and kept
    assert checked(second)["ORD-1-A"] is False  # held before, dropped now: missing


def test_a_previous_summary_stored_without_a_check_gives_the_facts_of_its_text(
    conversation, openai_server
):
    """A summary written before ctxsum stored coverage: what its text holds is carried,
    not what the messages it covers held."""
    first = compact(conversation, openai_server, batch(1), "Ship ORD-1-A to Bob Stone.")
    Summary.objects.filter(pk=first.pk).update(coverage=None, coverage_facts=None)

    second = compact(conversation, openai_server, batch(2), "Ship ORD-2-A for Bob Stone.")

    facts = checked(second)
    assert facts["ORD-1-A"] is False and facts["Bob Stone"] is True  # of v1's text
    assert "ORD-1-B" not in facts and "INV-1-7" not in facts  # of v1's messages only
    assert facts["ORD-2-A"] is True and facts["INV-2-7"] is False
