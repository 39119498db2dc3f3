"""Pure: how one key fact reads in the context's facts block, and what its line costs.

Shared by the summarizer's merge, a person's edits and the context read. A fact's stored
``token_count`` is its line counted with one encoding (``fact_block.line_tokens`` says
which); the block as a whole is counted exactly with its conversation's.
"""

from __future__ import annotations

from ctxsum import tokens

# The facts block is one user message: this header, then one line per fact.
FACTS_HEADER = "Key facts (kept beside the summary; pinned first):"
MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 2000


def one_line(text: str) -> str:
    """``text`` on one line with single spaces: how the block shows a value (a newline in
    it cannot pass for another fact's line), and what two values are compared by."""
    return " ".join(text.split())


def fact_line(key: str, value: str) -> str:
    """One fact as a line of the block."""
    return f"- {key}: {one_line(value)}"


def fact_tokens(key: str, value: str, *, model: str | None = None) -> int:
    """Tokens of the fact's line, newline included, in ``model``'s encoding."""
    return tokens.count_text(fact_line(key, value) + "\n", model=model)
