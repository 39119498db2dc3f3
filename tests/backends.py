"""A summarizer backend for tests that lets a test act while a summary is being written,
the moment another worker could act in production (no lock is held then)."""

from __future__ import annotations

from collections.abc import Callable

from ctxsum.summarizers.base import Summarizer, SummaryAnswer
from ctxsum.summarizers.facts import ProposedFact
from ctxsum.summarizers.offline import OfflineSummarizer


class HookSummarizer(Summarizer):
    """Summarizes like a tiny extractive model and runs ``during`` inside the call."""

    requires_network = False
    deterministic = True
    during: Callable[[], None] | None = None
    calls: list[str] = []

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        type(self).calls.append(history)
        hook, type(self).during = type(self).during, None
        if hook is not None:
            hook()
        return f"summary of {history.count('<')} tags"


class CrashingSummarizer(Summarizer):
    """A backend with a bug: every call raises something that is not a SummarizerError."""

    requires_network = False

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        raise RuntimeError("backend bug")


class ReplySummarizer(Summarizer):
    """Answers every call with ``reply``: a summary of the size a test chose."""

    requires_network = False
    deterministic = True
    reply = "A summary."

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        return type(self).reply


class FactsHookSummarizer(Summarizer):
    """Answers ``reply`` with the key facts ``facts`` (``ProposedFact``s, set by the test)
    and runs ``during`` inside the call, as HookSummarizer does."""

    requires_network = False
    deterministic = True
    reply = "A summary."
    facts: tuple[ProposedFact, ...] = ()
    during: Callable[[], None] | None = None

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        return self.answer(prompt=prompt, history=history, model=model, budget=budget).summary

    def answer(self, *, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        hook, type(self).during = type(self).during, None
        if hook is not None:
            hook()
        return SummaryAnswer(summary=type(self).reply, facts=type(self).facts)


class OfflineHookSummarizer(OfflineSummarizer):
    """The offline summarizer (extractive: it keeps ids, names, card numbers) running
    ``during`` inside its call; ``histories`` records what every call read."""

    during: Callable[[], None] | None = None
    histories: list[str] = []

    def answer(self, *, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        type(self).histories.append(history)
        hook, type(self).during = type(self).during, None
        if hook is not None:
            hook()
        return super().answer(prompt=prompt, history=history, model=model, budget=budget)
