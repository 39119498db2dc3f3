"""Pure: how one key fact reads in the context's facts block, what its line costs, and
whether the rest of the context already carries its value."""

from __future__ import annotations

import re

from ctxsum import tokens
from ctxsum.summarizers.facts import one_line

# The facts block is one user message: this header, then one line per fact.
FACTS_HEADER = "Key facts (kept beside the summary; pinned first):"
# A shorter value ("12", "yes", "Ana") is found by chance in any text, and its line costs
# a few tokens: it is never taken as carried.
MIN_CARRIED_CHARS = 4


def fact_line(key: str, value: str) -> str:
    """One fact as a line of the block."""
    return f"- {key}: {one_line(value)}"


def fact_tokens(key: str, value: str, *, model: str | None = None) -> int:
    """Tokens of the fact's line, newline included, in ``model``'s encoding."""
    return tokens.count_text(fact_line(key, value) + "\n", model=model)


def normalized(text: str) -> str:
    """``text`` case-folded, its runs of white space one space: what ``carries`` compares."""
    return " ".join(text.casefold().split())


def carries(context: str, value: str) -> bool:
    """Whether ``context`` (``normalized``) holds ``value``, normalized, as a whole: not
    inside a longer word or number (``AI-101`` is not in ``AI-1012``)."""
    text = normalized(value)
    if len(text) < MIN_CARRIED_CHARS or text not in context:
        return False
    edges = [r"\b" if char.isalnum() or char == "_" else "" for char in (text[0], text[-1])]
    return re.search(edges[0] + re.escape(text) + edges[1], context) is not None
