"""The summarizer backend interface: one raw call that turns formatted history into a summary,
and the key facts beside it. A backend makes exactly one attempt and never makes a summary up:
any failure, a blank answer included, raises ``SummarizerError``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from asgiref.sync import sync_to_async
from django.core import checks

from ctxsum.exceptions import SummarizerError
from ctxsum.hooks import summary_facts_wanted
from ctxsum.summarizers.facts import ProposedFact

BLANK_SUMMARY = "The summarizer returned a blank summary."
BLANK_INPUT = "There is no history to summarize."
NO_FACTS = "The summarizer {backend} returns a summary without key facts."

E_UNKNOWN_OPTIONS = "ctxsum.E011"
UNKNOWN_OPTIONS = "Unknown SUMMARIZER_OPTIONS for {backend}: {names}."


@dataclass(frozen=True, kw_only=True)
class SummaryAnswer:
    """One call's answer: the summary (stripped), the key facts it proposed (not checked
    against the history yet: ``ctxsum.summarizers.facts.facts_checked``), and why facts were
    skipped, in words (an unparseable block, a backend without facts…), and the model that
    answered as the backend reports it (blank: the model asked for; ``Summary.model``)."""

    summary: str
    facts: tuple[ProposedFact, ...] = ()
    facts_skipped: tuple[str, ...] = ()
    model: str = ""


class Summarizer(ABC):
    """A summarizer backend, chosen by dotted path in ``CTXSUM["SUMMARIZER"]``.

    Capability flags tell callers what to expect: ``requires_network`` (the call leaves the
    process and may be slow or fail) and ``deterministic`` (same input, same summary).
    """

    requires_network: ClassVar[bool] = True
    deterministic: ClassVar[bool] = False

    def __init__(
        self,
        *,
        model: str,
        timeout: float,
        max_tokens: int,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.options: dict[str, Any] = dict(options or {})

    @abstractmethod
    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        """Summarize ``history`` (one user message) following ``prompt`` (the system
        instruction, which already states the length budget) with ``model``; return the
        summary stripped, or raise ``SummarizerError`` (``SummaryTruncated`` for an answer
        cut off at ``max_tokens``). ``budget`` is the length asked for, in tokens: the
        answer may exceed it, never ``max_tokens``."""

    def answer(self, *, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        """The summary and the key facts ``facts_instruction()`` asked for, of one call: what
        a compaction calls. This default, for backends that extract none, skips the facts with
        the reason (a ``SummaryAnswer`` from ``summarize()`` is taken as it is); without an app
        that takes facts (``summary_facts_wanted``), the summary alone."""
        result: Any = self.summarize(prompt=prompt, history=history, model=model, budget=budget)
        if not summary_facts_wanted():
            text = result.summary if isinstance(result, SummaryAnswer) else result
            return SummaryAnswer(summary=text)
        if isinstance(result, SummaryAnswer):
            return result
        return SummaryAnswer(
            summary=result, facts_skipped=(NO_FACTS.format(backend=self.dotted_path()),)
        )

    async def aanswer(self, *, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        """``answer()`` for the async API (``aconversation_compact``). This default runs it in
        a thread of its own, so a backend without an async client never blocks the event
        loop nor the thread that serves the database; a backend with one overrides it."""
        call = sync_to_async(self.answer, thread_sensitive=False)
        return await call(prompt=prompt, history=history, model=model, budget=budget)

    def facts_instruction(self) -> str:
        """What the prompt adds so that the answer carries key facts, in the form this
        backend parses; blank for a backend that extracts none (or none from the prompt)."""
        return ""

    def check(self) -> list[checks.CheckMessage]:
        """Configuration problems, reported through Django's system checks."""
        return []

    @classmethod
    def dotted_path(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    def unknown_options(self, known: frozenset[str]) -> list[checks.CheckMessage]:
        """An Error naming the options this backend does not understand (typos, mostly)."""
        unknown = sorted(set(self.options) - known)
        if not unknown:
            return []
        return [
            checks.Error(
                UNKNOWN_OPTIONS.format(backend=self.dotted_path(), names=", ".join(unknown)),
                hint=f"Known options: {', '.join(sorted(known)) or 'none'}.",
                obj=self.dotted_path(),
                id=E_UNKNOWN_OPTIONS,
            )
        ]

    @staticmethod
    def require_history(history: str) -> None:
        # Summarizing nothing can only produce an invented summary.
        if not history or not history.strip():
            raise SummarizerError(BLANK_INPUT)
