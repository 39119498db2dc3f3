"""Pure: how one key fact reads in the context's facts block, and what it costs there.

Shared by the summarizer's merge, a person's edits and the context read, so a fact's stored
``token_count`` is always what its line costs.
"""

from __future__ import annotations

from ctxsum import tokens

# The facts block is one user message: this header, then one line per fact.
FACTS_HEADER = "Key facts (kept beside the summary; pinned first):"
MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 2000


def fact_line(key: str, value: str) -> str:
    """One fact as a line of the block; newlines inside the value are flattened so a value
    cannot pass for another fact's line."""
    flat = " ".join(value.split())
    return f"- {key}: {flat}"


def fact_tokens(key: str, value: str, *, model: str | None = None) -> int:
    """Tokens of the fact's line, newline included."""
    return tokens.count_text(fact_line(key, value) + "\n", model=model)
