"""The pinned front of a context through real compactions: the leading message, the summary
and the key facts block. A compaction with a facts block keeps all of ``keep`` when the
trigger allows it (the policy's bound counts all three pinned messages), and a compaction
across a mid-history change of the system prompt archives the non-leading rows only."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from ctxsum.facts.lines import FACTS_HEADER
from ctxsum.models import Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import context_get
from ctxsum.services import (
    conversation_compact,
    conversation_create,
    conversation_update,
    message_append,
)
from tests.factories import (
    FILLER,
    OFFLINE_SUMMARIZER,
    assistant_message,
    system_message,
    user_message,
)
from tests.invariants import assert_context_invariants
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

SYSTEM = "You are a travel assistant."


@pytest.fixture(autouse=True)
def offline(settings: Any) -> None:
    # The offline summarizer proposes key facts (identifiers, e-mail addresses, amounts).
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": OFFLINE_SUMMARIZER}


def history(first: int, count: int) -> list[dict[str, Any]]:
    """Long user messages naming an order and a mailbox, and short answers, in turn."""
    return [
        user_message(f"u{index}: order AI-10{index}, write to ana{index}@example.com. {FILLER}")
        if index % 2 == 0
        else assistant_message(f"Noted {index}.")
        for index in range(first, first + count)
    ]


def active_seqs(conversation: Conversation) -> list[int]:
    rows = Message.objects.filter(conversation=conversation).active().order_by("seq")
    return list(rows.values_list("seq", flat=True))


# --- the facts block and keep ---------------------------------------------------------


def test_a_policy_whose_keep_and_pinned_messages_reach_the_trigger_is_refused(user) -> None:
    # System message, summary, facts block and 3 kept reach a trigger of 6.
    with pytest.raises(ValidationError) as refused:
        conversation_create(owner=user, trigger={"messages": 6}, keep={"messages": 3})
    assert "Keep at most 2 messages" in str(refused.value.message_dict["keep"])


def test_with_a_facts_block_a_compaction_keeps_all_of_keep(user) -> None:
    """Trigger 7, keep 3: the compacted context is the system message, the summary, the
    facts block and the three newest messages (6 messages), below the trigger."""
    conversation = conversation_create(
        owner=user,
        system=SYSTEM,
        messages=history(0, 6),
        trigger={"messages": 7},
        keep={"messages": 3},
    )
    first = conversation_compact(conversation=conversation)  # 7 messages reach 7
    assert first.compacted, first.reason
    assert conversation.facts_tokens > 0, "the offline summarizer proposed no key facts"
    assert first.context.messages[2]["content"].startswith(FACTS_HEADER)
    assert active_seqs(conversation) == [0, 4, 5, 6]

    later = history(6, 2)
    message_append(conversation=conversation, messages=later)  # seqs 7-8: 8 messages
    second = conversation_compact(conversation=conversation)

    assert second.compacted and not second.over_trigger, second.reason
    assert (second.summary.from_seq, second.summary.to_seq) == (1, 5)
    messages = context_get(conversation=conversation).messages
    assert messages[0] == system_message(SYSTEM)
    assert messages[2]["content"].startswith(FACTS_HEADER)
    assert messages[3:] == [*history(0, 6)[5:], *later]
    assert len(messages) == 6 and active_seqs(conversation) == [0, 6, 7, 8]
    assert_context_invariants(conversation)


# --- the archive filter and a mid-history system prompt ---------------------------------


def change_system_mid_history(user: Any, api: Any, via: str) -> Conversation:
    """Old system prompt (seq 0) and seqs 1-4; the prompt replaced (the new one is seq 5,
    the old one replaced); then seqs 6-9. The archived range 1-7 spans seq 5."""
    conversation = conversation_create(
        owner=user,
        system="You are a rail assistant.",
        messages=history(0, 4),
        trigger={"messages": 8},
        keep={"messages": 2},
    )
    if via == "service":
        conversation_update(conversation=conversation, system=SYSTEM)
    else:
        response = api.patch(
            api_url("conversation-detail", conversation), {"system": SYSTEM}, format="json"
        )
        assert response.status_code == 200, response.json()
    message_append(conversation=conversation, messages=history(4, 4))
    return conversation


@pytest.mark.parametrize("via", ["service", "patch"])
def test_a_compaction_across_a_system_prompt_change_archives_only_non_leading_rows(
    user, api, via
) -> None:
    conversation = change_system_mid_history(user, api, via)
    leading = Message.objects.filter(conversation=conversation, is_leading=True).order_by("seq")
    assert [(row.seq, row.replaced_at is not None) for row in leading] == [(0, True), (5, False)]

    result = conversation_compact(conversation=conversation)

    assert (result.compacted, result.reason) == (True, Reason.COMPACTED)
    assert [row.seq for row in result.archived] == [1, 2, 3, 4, 6, 7]
    summary = Summary.objects.get(conversation=conversation, active=True)
    assert (summary.from_seq, summary.to_seq) == (1, 7)
    archived = Message.objects.filter(conversation=conversation, summary=summary)
    assert sorted(archived.values_list("seq", flat=True)) == [1, 2, 3, 4, 6, 7]
    assert not leading.exclude(summary=None).exists(), "a leading row was archived"
    assert active_seqs(conversation) == [5, 8, 9]
    assert result.context.messages[0] == system_message(SYSTEM)
    assert result.context.messages[-2:] == history(4, 4)[2:]
    assert_context_invariants(conversation)
