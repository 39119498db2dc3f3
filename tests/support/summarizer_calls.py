"""What ``conversation_compact`` sent the summarizer: every call recorded by wrapping the
configured backend, and checked against what ctxsum says a call must carry (the prompt
with the backend's facts instruction and the length budget, the budget, the model).
Importing it needs Django configured."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# Bound here at import, not looked up on the compaction module at call time: a test that
# swaps the engine's helper for a broken one must still be caught by these checks.
from ctxsum.services.summaries import summary_model, summary_prompt
from ctxsum.summarizers import get_summarizer
from ctxsum.summarizers.base import SummaryAnswer


@dataclass(frozen=True)
class SummarizerCall:
    """What ``conversation_compact`` sent the summarizer in one call, and what came back."""

    prompt: str
    model: str
    budget: int
    text: str
    answered: str = ""  # the model the backend reports (SummaryAnswer.model; blank: ``model``)


@contextmanager
def summarizer_calls() -> Iterator[list[SummarizerCall]]:
    """Record every call to the configured summarizer inside the block (the backend
    instance ``get_summarizer()`` hands out, wrapped for the block's duration; blocks
    nest)."""
    summarizer = get_summarizer()
    calls: list[SummarizerCall] = []
    original = summarizer.answer  # what a compaction calls: the summary and its facts

    def answer(*, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        result = original(prompt=prompt, history=history, model=model, budget=budget)
        call = SummarizerCall(
            prompt=prompt, model=model, budget=budget, text=result.summary, answered=result.model
        )
        calls.append(call)
        return result

    wrapped = vars(summarizer).get("answer")  # an outer block's wrapper, if any
    summarizer.answer = answer  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        if wrapped is None:
            del summarizer.answer
        else:
            summarizer.answer = wrapped  # type: ignore[method-assign]


def call_problems(result: Any, calls: Sequence[SummarizerCall]) -> list[str]:
    """What is wrong with the summarizer calls of a compaction that reached the summarizer:
    each sent PROMPT plus the plan's length budget, the expected model, and that budget."""
    if not calls:
        return ["the summarizer was not called"]
    budget = result.plan.summary_budget if result.plan is not None else None
    model = summary_model(result.context.conversation)
    problems = []
    for call in calls:
        if call.budget != budget:
            problems.append(f"summarizer asked for {call.budget} tokens, the plan says {budget}")
        if call.prompt != summary_prompt(call.budget, get_summarizer().facts_instruction()):
            problems.append(
                "the prompt sent is not PROMPT + the facts instruction + the length budget line"
            )
        if call.model != model:
            problems.append(f"summarizer called with model {call.model!r}, expected {model!r}")
    return problems
