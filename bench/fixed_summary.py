"""The same fixed-size summary for both sides of the comparison.

``FIXED_SUMMARY`` is exactly ``SUMMARY_TOKENS`` tokens of o200k_base. ``FixedSummarizer`` is
a ctxsum summarizer backend (``CTXSUM["SUMMARIZER"] = "bench.fixed_summary.FixedSummarizer"``)
that answers every call with it and records what it was sent, so the benchmark can bill the
summarizer's input and output. ``FixedFactsSummarizer`` answers with the same text and the
key facts the offline backend finds in the history, as ctxsum's defaults have it: the
summarizer is asked for facts, and the facts are billed as the OpenAI backend's answer
carries them (a ``<facts>`` JSON block after the summary). The LangChain side's fake chat
model (bench/lc_fake.py) writes the same text. No LangChain import here.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import ClassVar

from ctxsum import tokens
from ctxsum.summarizers.base import Summarizer, SummaryAnswer
from ctxsum.summarizers.facts import CLOSE_TAG, OPEN_TAG
from ctxsum.summarizers.offline import OfflineSummarizer
from ctxsum.summarizers.openai import FACTS_INSTRUCTIONS

SUMMARY_TOKENS = 120
ENCODING = "o200k_base"
_TEXT = (
    "The user asked the assistant to change a booking; the assistant looked up the "
    "reservation, checked the options, quoted the prices and confirmed what was agreed. "
    "Facts so far: identifiers, dates, amounts and the decisions taken are listed here, "
    "with what is still pending and what the user wants next. "
)
_WORDS = _TEXT.split()


@functools.cache
def fixed_summary(size: int = SUMMARY_TOKENS) -> str:
    """A deterministic English text of exactly ``size`` o200k_base tokens."""
    encoding = tokens.get_encoding(ENCODING)
    words: list[str] = []
    index = 0
    while True:
        candidate = " ".join([*words, _WORDS[index % len(_WORDS)]])
        count = len(encoding.encode(candidate))
        if count > size:
            break
        words.append(_WORDS[index % len(_WORDS)])
        index += 1
    text = " ".join(words)
    # Pad with single-token words until the size is exact.
    while len(encoding.encode(text)) < size:
        text += " and"
    return text


FIXED_SUMMARY = fixed_summary()


@dataclass(frozen=True)
class SummarizerCall:
    """What one call of the ctxsum summarizer was sent, and the answer's text as a chat
    model would write it (the summary, then any facts)."""

    prompt: str
    history: str
    answer: str = FIXED_SUMMARY


class FixedSummarizer(Summarizer):
    """Writes ``FIXED_SUMMARY`` whatever it is sent; records every call."""

    requires_network = False
    deterministic = True
    calls: ClassVar[list[SummarizerCall]] = []

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        self.require_history(history)
        type(self).calls.append(SummarizerCall(prompt=prompt, history=history))
        return FIXED_SUMMARY


class FixedFactsSummarizer(OfflineSummarizer):
    """``FIXED_SUMMARY`` (no identifiers), with the key facts the offline backend finds in
    the history; asks for them as the OpenAI backend's default (``tagged``) format does, and
    records every call in ``FixedSummarizer.calls``, its answer written in that format."""

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        return FIXED_SUMMARY

    def facts_instruction(self) -> str:
        return FACTS_INSTRUCTIONS["tagged"]

    def answer(self, *, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        self.require_history(history)
        answer = super().answer(prompt=prompt, history=history, model=model, budget=budget)
        facts = [
            {"key": fact.key, "value": fact.value, "source_seqs": list(fact.source_seqs)}
            for fact in answer.facts
        ]
        written = f"{answer.summary}\n{OPEN_TAG}{json.dumps(facts)}{CLOSE_TAG}"
        FixedSummarizer.calls.append(SummarizerCall(prompt=prompt, history=history, answer=written))
        return answer


def ctxsum_call_tokens(call: SummarizerCall) -> tuple[int, int]:
    """Input and output tokens of one ctxsum summarizer call, as the OpenAI backend sends
    it: a system message with the prompt and a user message with the history."""
    sent = [
        tokens.count_message({"role": "system", "content": call.prompt}),
        tokens.count_message({"role": "user", "content": call.history}),
    ]
    return tokens.context_tokens(sent), tokens.count_text(call.answer)
