"""Pure: how one key fact reads in the context's facts block, and what its line costs."""

from __future__ import annotations

from ctxsum import tokens
from ctxsum.summarizers.facts import one_line

# The facts block is one user message: this header, then one line per fact.
FACTS_HEADER = "Key facts (kept beside the summary; pinned first):"


def fact_line(key: str, value: str) -> str:
    """One fact as a line of the block."""
    return f"- {key}: {one_line(value)}"


def fact_tokens(key: str, value: str, *, model: str | None = None) -> int:
    """Tokens of the fact's line, newline included, in ``model``'s encoding."""
    return tokens.count_text(fact_line(key, value) + "\n", model=model)
