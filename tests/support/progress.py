"""A progress line for long runs: on stderr, at most every few seconds, so a log stays
short and the measured run is not slowed by its own output."""

from __future__ import annotations

import sys
import time

PROGRESS_SECONDS = 5.0


class Progress:
    """``[replay] done/total conversations, …`` on stderr every ``PROGRESS_SECONDS``."""

    def __init__(self, total: int, *, every: float = PROGRESS_SECONDS) -> None:
        self.total = total
        self.every = every
        self.started = time.monotonic()
        self.shown = self.started

    def update(
        self, conversations: int, messages: int, compactions: int, *, force: bool = False
    ) -> None:
        """Show the counts so far, unless the last line is more recent than ``every``
        seconds (``force``: show them anyway, e.g. at the end)."""
        now = time.monotonic()
        if not force and now - self.shown < self.every:
            return
        self.shown = now
        elapsed = now - self.started
        rate = messages / elapsed if elapsed else 0.0
        print(
            f"[replay] {conversations}/{self.total} conversations, {messages} messages, "
            f"{compactions} compactions, {elapsed:.0f} s ({rate:.0f} messages/s)",
            file=sys.stderr,
            flush=True,
        )
