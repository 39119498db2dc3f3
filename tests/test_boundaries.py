"""Inclusive edges that an off-by-one would move: a redaction of exactly the last message a
summary covers (its ``to_seq``) makes that summary stale, and a key fact whose line brings
the facts block to exactly FACTS_MAX_TOKENS is shown."""

from __future__ import annotations

import pytest

from ctxsum.facts.block import block_tokens, facts_chosen
from ctxsum.facts.lines import FACTS_HEADER
from ctxsum.facts.services import fact_add
from ctxsum.models import Summary
from ctxsum.selectors import context_get, current_prompt, stale_summaries
from ctxsum.services import conversation_create, message_redact
from ctxsum.tokens import count_message
from tests.factories import compact, long_user_message, turns

pytestmark = pytest.mark.django_db


# --- redaction at a summary's to_seq ----------------------------------------------------


def test_redacting_the_message_at_a_summarys_to_seq_makes_it_stale(user) -> None:
    conversation = conversation_create(
        owner=user,
        system="You are a travel assistant.",
        messages=[long_user_message(f"u{index}") for index in range(6)],
        trigger={"messages": 7},
        keep={"messages": 2},
    )
    summary = compact(conversation).summary
    assert summary is not None and (summary.from_seq, summary.to_seq) == (1, 4)
    assert summary not in stale_summaries()

    message_redact(conversation=conversation, seq=summary.to_seq)

    summary.refresh_from_db()
    assert summary.covers_redacted
    assert summary in Summary.objects.stale(**current_prompt())
    assert summary in stale_summaries()


# --- a fact at the facts budget ---------------------------------------------------------


def test_a_fact_that_brings_the_block_to_exactly_its_budget_is_shown(user, settings) -> None:
    """The choice adds each fact's line (``token_count``, its newline included) to the
    header's tokens; a fact whose line brings that sum to exactly FACTS_MAX_TOKENS fits."""
    conversation = conversation_create(owner=user, messages=turns(2))
    fact = fact_add(user=user, conversation=conversation, key="flight", value="AI-865 on 20 Oct")
    budget = header_tokens() + fact.token_count
    settings.CTXSUM = {**settings.CTXSUM, "FACTS_MAX_TOKENS": budget}

    assert facts_chosen([fact]) == [fact]
    assert block_tokens([fact]) <= budget
    context = context_get(conversation=conversation)
    assert [shown.pk for shown in context.shown("facts")] == [fact.pk]
    assert any(str(m["content"]).startswith(FACTS_HEADER) for m in context.messages)


def header_tokens() -> int:
    return count_message({"role": "user", "content": FACTS_HEADER})
