"""Counters and erasure under any mix of appends, redactions, compactions, rebuilds,
reverts and fact edits, some of them landing inside a summarizer's call.

A hypothesis state machine drives one conversation through the real services; after every
step the invariants of tests/invariants.py hold, (f) erasure included: every message
carries a distinctive code, so a redacted one's words can be looked for in the context,
every summary and the facts. The counters (``active_tokens``, ``facts_tokens``, the message
counts) equal their row sums after every step (invariant e), and none is ever negative.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.test import override_settings
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ctxsum.facts.models import Fact
from ctxsum.facts.services import fact_add, fact_change, fact_delete
from ctxsum.models import Conversation, Summary
from ctxsum.selectors import context_get
from ctxsum.services import (
    conversation_compact,
    conversation_create,
    conversation_rebuild,
    conversation_revert,
    message_append,
    message_redact,
)
from tests.backends import OfflineHookSummarizer
from tests.factories import tool_call, tool_result
from tests.invariants import assert_context_invariants
from tests.profiles import examples

WORDS = ("flight", "Delhi", "hotel", "window", "refund", "Mumbai", "seat", "order", "bag")
CTXSUM = {
    "SUMMARIZER": "tests.backends.OfflineHookSummarizer",
    "AUTO_COMPACT": False,
    "SUMMARY_MAX_TOKENS": 120,
}


class Conversations(RuleBasedStateMachine):
    """One conversation, with a system prompt, a small trigger and keep."""

    def __init__(self) -> None:
        super().__init__()
        # Numbered, not random: a random code (or call id) tokenizes to a varying number of
        # tokens, so the same steps would plan differently from one run to the next, and
        # Hypothesis refuses data generation that depends on more than its draws.
        self.numbers = itertools.count(1)
        self.appended: list[dict[str, Any]] = []
        self.steps = 0

    @initialize(keep=st.integers(1, 3), trigger=st.integers(7, 10))
    def create(self, keep: int, trigger: int) -> None:
        owner = get_user_model().objects.create(username=f"erasure-{uuid.uuid4().hex}")
        self.user = owner
        self.conversation = conversation_create(
            owner=owner,
            system="You book travel.",
            trigger={"messages": trigger},
            keep={"messages": keep},
        )
        self.appended.append({"role": "system", "content": "You book travel."})
        for words in (["flight"] * 5, ["hotel", "Delhi"] * 3, ["seat"] * 6, ["refund"] * 4):
            self.append(words, tool=False)

    def fresh(self) -> Conversation:
        self.conversation = Conversation.objects.get(pk=self.conversation.pk)
        return self.conversation

    def summarized(self) -> bool:
        """Whether a message left the context: there is a summary to rebuild."""
        row = getattr(self, "conversation", None)
        return row is not None and row.message_count > row.active_message_count

    def code(self) -> str:
        """A distinctive code: a redacted message's words can be searched for."""
        return f"ZX{next(self.numbers):08d}"

    def text(self, words: list[str]) -> str:
        return f"{' '.join(words).capitalize()} code {self.code()} for the booking."

    def store(self, messages: list[dict[str, Any]]) -> None:
        message_append(conversation=self.fresh(), messages=messages)
        self.appended.extend(message_append_form(m) for m in messages)

    @rule(words=st.lists(st.sampled_from(WORDS), min_size=4, max_size=14), tool=st.booleans())
    def append(self, words: list[str], tool: bool) -> None:
        text = self.text(words)
        if tool:
            call_id = f"call_{next(self.numbers):08d}"
            call = {"role": "assistant", "content": None, "tool_calls": [tool_call(call_id)]}
            self.store([call, tool_result(call_id, text)])
        else:
            role = "user" if len(self.appended) % 2 else "assistant"
            self.store([{"role": role, "content": text}])

    @precondition(lambda self: len(self.appended) > 1)
    @rule(data=st.data())
    def redact(self, data: st.DataObject) -> None:
        seq = data.draw(st.integers(1, len(self.appended) - 1), label="redact seq")
        message_redact(conversation=self.fresh(), seq=seq)

    def meanwhile(self, data: st.DataObject) -> str:
        """What may happen inside the summarizer's call: a redaction, an append, or nothing."""
        what = data.draw(st.sampled_from(["nothing", "redact", "append"]), label="meanwhile")
        if what == "redact":
            # Half the time one of the active messages, which the compaction may archive.
            active = self.fresh().messages.active().filter(is_leading=False)
            seqs = sorted(active.values_list("seq", flat=True)) or [1]
            anywhere = st.integers(1, len(self.appended) - 1)
            seq = data.draw(st.sampled_from(seqs) | anywhere, label="redact meanwhile")
            fresh = self.fresh
            OfflineHookSummarizer.during = lambda: message_redact(conversation=fresh(), seq=seq)
        elif what == "append":
            text = self.text(["meanwhile"])
            OfflineHookSummarizer.during = lambda: self.store([{"role": "user", "content": text}])
        else:
            OfflineHookSummarizer.during = None
        return str(what)

    @precondition(lambda self: len(self.appended) > 1)
    @rule(data=st.data(), force=st.sampled_from([True, True, False]))
    def compact(self, data: st.DataObject, force: bool) -> None:
        what = self.meanwhile(data)
        result = conversation_compact(conversation=self.fresh(), force=force)
        OfflineHookSummarizer.during = None
        event(f"compact: {result.reason}, {what} meanwhile")

    @precondition(lambda self: self.summarized())
    @rule(data=st.data())
    def rebuild(self, data: st.DataObject) -> None:
        what = self.meanwhile(data)
        result = conversation_rebuild(conversation=self.fresh())
        OfflineHookSummarizer.during = None
        event(f"rebuild: {result.reason}, {what} meanwhile")

    @rule()
    def revert(self) -> None:
        active = Summary.objects.filter(conversation=self.conversation, active=True).first()
        if active is not None:
            result = conversation_revert(conversation=self.fresh(), version=active.version)
            event(f"revert: {result.reverted}")

    @rule(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), pin=st.booleans())
    def fact_edit(self, words: list[str], pin: bool) -> None:
        facts = list(Fact.objects.filter(conversation=self.conversation))
        value = " ".join(words)
        if not facts:
            fact_add(user=self.user, conversation=self.fresh(), key="note", value=value)
        elif pin:
            fact_change(fact=facts[0], user=self.user, value=value, pinned=True)
        elif facts[0].changed_by == Fact.ChangedBy.PERSON:
            fact_delete(fact=facts[0], user=self.user)
        else:
            fact_change(fact=facts[0], user=self.user, value=value)

    @invariant()
    def holds(self) -> None:
        if not hasattr(self, "conversation"):
            return
        conversation = self.fresh()
        assert min(conversation.active_tokens, conversation.facts_tokens) >= 0
        assert conversation.active_message_count >= 0
        assert_context_invariants(conversation, original_messages=self.appended)
        assert context_get(conversation=conversation).token_count == conversation.context_tokens


def message_append_form(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` in the normalized form the transcript returns (``content`` present)."""
    return {"content": None, **message} if "content" not in message else dict(message)


@pytest.mark.django_db
@pytest.mark.slow
def test_counters_and_erasure_hold_under_every_mix_of_operations() -> None:
    machine = Conversations.TestCase
    machine.settings = settings(
        max_examples=examples(40),  # full size in the ci profile (tests/profiles.py)
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    with override_settings(CTXSUM=CTXSUM):
        try:
            machine().runTest()
        except ValidationError as error:  # pragma: no cover - shows what was refused
            raise AssertionError(f"a valid step was refused: {error}") from error
