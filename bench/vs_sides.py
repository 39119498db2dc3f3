"""What every side of the comparison reports for one conversation, and the two baselines
that need no summarizer: the full history, and a window of the last N messages.

A "call" is a model call at an assistant turn of the recorded conversation: the call at
index ``i`` (the assistant message's position, system message included) is sent what the
side makes of ``messages[:i]``, and its answer is the recorded assistant message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxsum import tokens


@dataclass(frozen=True)
class Call:
    """One model call: the message index it answers, the tokens sent (the whole request),
    and the tokens of the system message in it (0 when it has none)."""

    index: int
    sent: int
    system: int


@dataclass
class SideResult:
    """One side's calls on one conversation, and what its summarizer cost."""

    calls: list[Call] = field(default_factory=list)
    summarizer_calls: int = 0
    summarizer_in: int = 0
    summarizer_out: int = 0
    summaries: int = 0
    system_kept: bool | None = None  # None: the conversation has no system message
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def sent(self) -> int:
        return sum(call.sent for call in self.calls)

    @property
    def billed(self) -> int:
        """Input tokens of every call plus the summarizer's input and output tokens."""
        return self.sent + self.summarizer_in + self.summarizer_out

    def as_json(self) -> dict[str, Any]:
        return {
            "calls": len(self.calls),
            "sent": self.sent,
            "billed": self.billed,
            "summarizer_calls": self.summarizer_calls,
            "summarizer_in": self.summarizer_in,
            "summarizer_out": self.summarizer_out,
            "summaries": self.summaries,
            "system_kept": self.system_kept,
            **({"reasons": self.reasons} if self.reasons else {}),
        }


def has_system(messages: Sequence[Mapping[str, Any]]) -> bool:
    return bool(messages) and messages[0].get("role") == "system"


def call_indices(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Positions of the assistant messages: one model call each."""
    return [index for index, message in enumerate(messages) if message["role"] == "assistant"]


def message_counts(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Tokens of each recorded message as part of a chat request (ctxsum.tokens)."""
    return [tokens.count_message(message) for message in messages]


def full_history(messages: Sequence[Mapping[str, Any]], counts: Sequence[int]) -> SideResult:
    """Every call is sent every message before it."""
    system = counts[0] if has_system(messages) else 0
    result = SideResult(system_kept=True if system else None)
    running = 0
    done = 0
    for index in call_indices(messages):
        running += sum(counts[done:index])
        done = index
        result.calls.append(Call(index, tokens.context_tokens([running]), system))
    return result


def window_start(messages: Sequence[Mapping[str, Any]], start: int, end: int) -> int:
    """The first message of a window ``messages[start:end]`` moved past tool results whose
    call is left out, so no result is sent without its request."""
    while start < end and messages[start]["role"] == "tool":
        start += 1
    return start


def last_messages(
    messages: Sequence[Mapping[str, Any]], counts: Sequence[int], size: int
) -> SideResult:
    """Every call is sent the system message (if any) and the last ``size`` messages before
    it, tool-pair safe (a window never starts with an orphan tool result)."""
    pinned = int(has_system(messages))
    system = counts[0] if pinned else 0
    result = SideResult(system_kept=True if pinned else None)
    for index in call_indices(messages):
        start = window_start(messages, max(pinned, index - size), index)
        sent = tokens.context_tokens([system, *counts[start:index]])
        result.calls.append(Call(index, sent, system))
    return result
