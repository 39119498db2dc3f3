"""The facts block leaves out a fact whose value the context already carries (the active
summary's text, a kept message), shows it again once that text has left the context, keeps
pinned facts first (shown even when carried) and stays within a budget that follows the
trigger. The summarizer is the real OpenAI backend against tests/openai_server.py; the
invariants (tests/invariants.py) are checked after every step."""

from __future__ import annotations

from typing import Any

import pytest

from ctxsum.facts.models import Fact
from ctxsum.facts.services import fact_add, fact_change
from ctxsum.models import Conversation
from ctxsum.selectors import context_get
from ctxsum.services import (
    conversation_compact,
    conversation_create,
    conversation_revert,
    message_append,
    message_redact,
)
from tests.factories import assistant_message, long_user_message, user_message
from tests.invariants import assert_context_invariants

pytestmark = pytest.mark.django_db

POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
ORDER = {"key": "order_id", "value": "AI-101", "source_seqs": [1]}
EMAIL = {"key": "email", "value": "ana@example.com", "source_seqs": [1]}


def build(owner: Any, kept: str = "Noted 6.", **fields: Any) -> Conversation:
    """A system prompt (seq 0) and six messages (seqs 1-6): a compaction archives 1-4 and
    keeps 5 and 6, whose text is ``kept``."""
    messages = [
        long_user_message("u1"),
        assistant_message("Noted 2."),
        long_user_message("u3"),
        assistant_message("Noted 4."),
        user_message("And then?"),
        assistant_message(kept),
    ]
    return conversation_create(
        owner=owner, system="You book trips.", messages=messages, **{**POLICY, **fields}
    )


def compact(conversation: Conversation) -> None:
    result = conversation_compact(conversation=conversation, force=True)
    assert result.compacted, result.reason
    assert_context_invariants(conversation)


def shown(conversation: Conversation) -> list[str]:
    """The keys the facts block shows now, checked against the conversation's counters."""
    context = context_get(conversation=conversation)
    conversation.refresh_from_db()
    block = [part.tokens for part in context.layout.pinned if part.kind == "facts"]
    assert block == ([conversation.facts_tokens] if conversation.facts_tokens else [])
    return [fact.key for fact in context.shown("facts")]


def test_a_fact_the_summary_holds_is_not_in_the_block(user, openai_summarizer):
    openai_summarizer.reply = "The user booked order ai-101; nothing else is open."
    openai_summarizer.facts = [ORDER, EMAIL]
    conversation = build(user)

    compact(conversation)

    assert shown(conversation) == ["email"]
    # Still stored, and said to be out of the block.
    assert Fact.objects.filter(conversation=conversation, key="order_id").exists()


def test_a_fact_a_kept_message_holds_comes_back_when_the_message_is_archived(
    user, openai_summarizer
):
    openai_summarizer.facts = [ORDER, EMAIL]
    conversation = build(user, kept="Your ticket AI-101 is on its way.")
    compact(conversation)
    assert shown(conversation) == ["email"]

    # An append does not recount the block (rule: only a change of the summary or of the
    # kept messages does): the new message holds the e-mail, the block still shows it.
    message_append(conversation=conversation, messages=[user_message("Mail ana@example.com")])
    assert shown(conversation) == ["email"]
    assert_context_invariants(conversation)

    # The next compaction archives the message that held AI-101 and keeps the one that
    # holds the e-mail address: the two facts trade places.
    openai_summarizer.facts = []
    message_append(conversation=conversation, messages=[assistant_message("Sent.")])
    message_append(conversation=conversation, messages=[user_message("Mail ana@example.com")])
    compact(conversation)
    assert shown(conversation) == ["order_id"]


def test_a_fact_comes_back_when_its_summary_is_reverted_or_its_message_redacted(
    user, openai_summarizer
):
    conversation = build(user, kept="Your ticket AI-101 is on its way.")
    fact_add(user=user, conversation=conversation, **{k: ORDER[k] for k in ("key", "value")})
    fact_add(user=user, conversation=conversation, key="city", value="Lisbon")
    assert shown(conversation) == ["city", "order_id"]  # no summary change yet: shown
    openai_summarizer.reply = "They fly to Lisbon."
    compact(conversation)
    assert shown(conversation) == []

    conversation_revert(conversation=conversation, version=1)
    assert_context_invariants(conversation)
    assert shown(conversation) == ["city"]  # seq 6 still holds AI-101

    message_redact(conversation=conversation, seq=6)
    assert_context_invariants(conversation)
    assert shown(conversation) == ["city", "order_id"]


def test_pinned_facts_come_first_and_are_shown_even_when_carried(user, openai_summarizer):
    conversation = build(user)
    city = fact_add(user=user, conversation=conversation, key="city", value="Lisbon")
    fact_add(user=user, conversation=conversation, key="hotel", value="Hotel Azul")
    openai_summarizer.reply = "They fly to Lisbon and stay at the Hotel Azul."
    openai_summarizer.facts = [EMAIL]
    compact(conversation)
    assert shown(conversation) == ["email"]

    fact_change(fact=city, user=user, pinned=True)

    assert shown(conversation) == ["city", "email"]
    assert_context_invariants(conversation)


def test_a_changed_value_is_shown_until_the_context_is_checked_again(user, openai_summarizer):
    conversation = build(user)
    city = fact_add(user=user, conversation=conversation, key="city", value="Lisbon")
    openai_summarizer.reply = "They fly to Lisbon."
    compact(conversation)
    assert shown(conversation) == []

    fact_change(fact=city, user=user, value="Porto")
    assert shown(conversation) == ["city"]
    fact_change(fact=city, user=user, value="Lisbon")  # the value the context carries
    assert shown(conversation) == []
    assert_context_invariants(conversation)


@pytest.mark.parametrize(
    ("policy", "budget"),
    [
        ({"trigger": {"tokens": 2000}}, 100),  # FACTS_TRIGGER_SHARE (0.05) of the trigger
        ({"trigger": {"tokens": 20000}}, 200),  # at most FACTS_MAX_TOKENS
        (POLICY, 200),  # a share of the model's default ceiling: over FACTS_MAX_TOKENS
        ({**POLICY, "max_context_tokens": 3000}, 150),  # of the ceiling
    ],
)
def test_the_block_budget_follows_the_trigger(user, policy, budget):
    conversation = conversation_create(owner=user, messages=[user_message("Hi")], **policy)
    for index in range(60):
        fact_add(user=user, conversation=conversation, key=f"code {index:02d}", value=f"X-{index}")

    keys = shown(conversation)

    conversation.refresh_from_db()
    assert budget - 15 < conversation.facts_tokens <= budget
    assert len(keys) < 60
    assert_context_invariants(conversation)


def test_a_subjects_fact_is_left_out_only_where_the_context_carries_it(user, openai_summarizer):
    fact_add(user=user, subject="acme", key="contract", value="C-7781")
    first, second = build(user, subject="acme"), build(user, subject="acme")
    openai_summarizer.reply = "Contract C-7781 renews in May."

    compact(first)

    assert shown(first) == [] and shown(second) == ["contract"]
    assert_context_invariants(second)


def test_a_block_whose_first_facts_are_all_carried_is_chosen_from_further_on(
    user, openai_summarizer
):
    # A budget of 100 tokens chooses from the first 34 facts (candidates_limit: one fact per
    # key without a subject), which the check marks among the first 68; the context carries
    # the newest 60 of 150.
    values = [f"Code-{index:03d}" for index in range(150)]
    conversation = build(user, kept=" ".join(values[90:]), trigger={"tokens": 2000})
    for index, value in enumerate(values):
        fact_add(user=user, conversation=conversation, key=f"code {index:03d}", value=value)
    openai_summarizer.reply = "Codes were read out."

    compact(conversation)

    keys = shown(conversation)
    # Only the oldest 90 are not carried: the block shows as many of them as fit.
    assert keys and set(keys) <= {f"code_{index:03d}" for index in range(90)}
    conversation.refresh_from_db()
    assert conversation.facts_tokens > 80
