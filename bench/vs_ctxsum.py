"""ctxsum on one recorded conversation, the way an application drives it: the system
message is the conversation's leading message, every later message is appended on its own
with ``message_append``, and before every model call (each recorded assistant turn)
``conversation_compact`` runs and its context is what the model is sent. The summarizer is
``bench.fixed_summary.FixedSummarizer`` (Django must be set up with it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from bench.common import KEEP_MESSAGES, TRIGGER_MESSAGES
from bench.fixed_summary import FixedSummarizer, ctxsum_call_tokens
from bench.vs_sides import Call, SideResult, call_indices, has_system
from ctxsum import tokens
from ctxsum.services import conversation_compact, conversation_create, message_append


class RecountMismatch(AssertionError):
    """ctxsum's own token count of a context differs from a recount of its messages."""


def recount(context: Any) -> None:
    """Raise RecountMismatch unless the context's token count equals counting its
    OpenAI-format messages again with ctxsum.tokens."""
    again = tokens.context_tokens(tokens.count_message(message) for message in context.messages)
    if again != context.token_count:
        raise RecountMismatch(f"context says {context.token_count} tokens, recount {again}")


def run_ctxsum(
    record: Mapping[str, Any],
    counts: Sequence[int],
    *,
    owner: Any,
    check: bool = False,
) -> SideResult:
    """Replay ``record`` through ctxsum; ``check`` recounts every context sent."""
    messages: Sequence[Mapping[str, Any]] = record["messages"]
    pinned = has_system(messages)
    FixedSummarizer.calls.clear()
    conversation = conversation_create(
        owner=owner,
        title=str(record["id"])[:200],
        trigger={"messages": TRIGGER_MESSAGES},
        keep={"messages": KEEP_MESSAGES},
        messages=[dict(messages[0])] if pinned else None,
    )
    result = SideResult(system_kept=True if pinned else None)
    reasons: Counter[str] = Counter()
    done = int(pinned)
    for index in call_indices(messages):
        for message in messages[done:index]:
            message_append(conversation=conversation, messages=[dict(message)])
        done = index
        compacted = conversation_compact(conversation=conversation)
        reasons[str(compacted.reason)] += 1
        context = compacted.context
        if check:
            recount(context)
        system = context.tokens[0] if context.layout.leading else 0
        result.calls.append(Call(index, context.token_count, system))
        if pinned and not system:
            result.system_kept = False
    result.summaries = reasons["compacted"]
    result.reasons = dict(reasons)
    for call in FixedSummarizer.calls:
        sent_in, sent_out = ctxsum_call_tokens(call)
        result.summarizer_in += sent_in
        result.summarizer_out += sent_out
    result.summarizer_calls = len(FixedSummarizer.calls)
    return result
