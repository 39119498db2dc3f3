"""The active context's layout: what is pinned at its front, and which messages form its body.

A context is sent as its pinned parts, in this order, then its body:

    [leading system/developer message]   kind "leading", if the conversation has one
    [the active summary]                  kind "summary", if there is one
    [contributed blocks]                  one per contributor that shows something (the key
                                          facts block, kind "facts")
    body: the active messages by seq      what a compaction may archive, oldest first

A compaction archives a prefix of the body, a range of seqs, behind a new summary; the
other pinned parts stay. ``selectors.context_get`` builds the layout once; the planner and
the compaction read it. Pure: no ORM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxsum.tokens import context_tokens

LEADING = "leading"
SUMMARY = "summary"
# The most parts a context pins: the leading message, the summary and the key facts block.
PINNED_MAX = 3


@dataclass(frozen=True)
class Part:
    """One pinned message of the context: what it is, and its tokens as sent."""

    kind: str
    tokens: int


@dataclass(frozen=True)
class SeqRange:
    """The body messages with ``first <= seq <= last``."""

    first: int
    last: int

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and self.first <= seq <= self.last


@dataclass(frozen=True, kw_only=True)
class ContextLayout:
    """The pinned parts, in context order, and the body's seqs and tokens, in seq order."""

    pinned: tuple[Part, ...] = ()
    body_seqs: tuple[int, ...] = ()
    body_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.body_seqs) != len(self.body_tokens):
            raise ValueError(
                f"{len(self.body_tokens)} token counts for {len(self.body_seqs)} messages."
            )
        kinds = [part.kind for part in self.pinned]
        expected = [kind for kind in (LEADING, SUMMARY) if kind in kinds]
        if kinds[: len(expected)] != expected or len(set(kinds)) != len(kinds):
            raise ValueError(f"pinned parts out of order: {kinds}.")

    def tokens_of(self, kind: str) -> int | None:
        """The tokens of the pinned part ``kind``; None when the context has none."""
        return next((part.tokens for part in self.pinned if part.kind == kind), None)

    @property
    def leading(self) -> bool:
        return self.tokens_of(LEADING) is not None

    @property
    def summary_tokens(self) -> int | None:
        return self.tokens_of(SUMMARY)

    @property
    def blocks(self) -> tuple[Part, ...]:
        """The contributed parts, which a compaction keeps as they are."""
        return tuple(part for part in self.pinned if part.kind not in (LEADING, SUMMARY))

    @property
    def message_count(self) -> int:
        return len(self.pinned) + len(self.body_seqs)

    @property
    def token_count(self) -> int:
        """The context's tokens as sent, reply priming included."""
        return context_tokens([*(part.tokens for part in self.pinned), *self.body_tokens])

    def body_range(self, stop: int) -> SeqRange | None:
        """The seqs of the body's first ``stop`` messages; None for none."""
        if stop <= 0:
            return None
        return SeqRange(self.body_seqs[0], self.body_seqs[stop - 1])

    def compacted(self, *, summary_tokens: int, kept: int) -> tuple[int, int]:
        """The message and token count once all but the newest ``kept`` are archived."""
        leading = [part.tokens for part in self.pinned if part.kind == LEADING]
        blocks = [part.tokens for part in self.blocks]
        tail = list(self.body_tokens[len(self.body_tokens) - kept :]) if kept else []
        sizes = [*leading, summary_tokens, *blocks, *tail]
        return len(sizes), context_tokens(sizes)


def layout_of(pinned: Sequence[Part], body: Sequence[tuple[int, int]]) -> ContextLayout:
    """A layout from its pinned parts and its body's (seq, tokens) pairs."""
    return ContextLayout(
        pinned=tuple(pinned),
        body_seqs=tuple(seq for seq, _ in body),
        body_tokens=tuple(tokens for _, tokens in body),
    )
