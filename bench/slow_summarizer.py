"""A summarizer backend that stands for a slow model call: it waits, then writes the fixed-size
summary of bench/fixed_summary.py. ``bench.background`` runs it on the task workers, so a
compaction holds its lease for as long as a real summarizer call would, without a model.

    CTXSUM["SUMMARIZER"] = "bench.slow_summarizer.SlowSummarizer"
    CTXSUM["SUMMARIZER_OPTIONS"] = {"seconds": 10}
"""

from __future__ import annotations

import time
from typing import ClassVar

from django.core import checks

from bench.fixed_summary import FIXED_SUMMARY
from ctxsum.summarizers.base import Summarizer

DEFAULT_SECONDS = 10.0
OPTIONS = frozenset({"seconds"})


class SlowSummarizer(Summarizer):
    """Sleeps ``SUMMARIZER_OPTIONS["seconds"]`` (default 10), then returns ``FIXED_SUMMARY``.
    The sleep holds no lock and uses no CPU, like waiting for a provider's answer."""

    requires_network = False
    deterministic: ClassVar[bool] = True

    @property
    def seconds(self) -> float:
        return float(self.options.get("seconds", DEFAULT_SECONDS))

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        self.require_history(history)
        time.sleep(self.seconds)
        return FIXED_SUMMARY

    def check(self) -> list[checks.CheckMessage]:
        return self.unknown_options(OPTIONS)
