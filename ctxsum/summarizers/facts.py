"""Pure: the key facts of a summarizer's answer, parsed and checked. No ORM, no I/O.

A summarizer proposes facts as a JSON list of ``{"key", "value", "source_seqs"}`` objects:
the ``facts`` of a structured (``json_schema``) answer, or a ``<facts>`` block after the
summary text. A fact that cannot be trusted is dropped with the reason in words (below),
for ``Summary.facts_skipped``: never repaired or made up, and a fact's trouble (JSON nested
too deeply to read included) never costs the summary.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxsum.validation import unstorable

# The longest key and value a fact may have: a fact's line of the facts block.
MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 2000

# Facts one answer may propose; the rest are dropped (and said so).
MAX_FACTS = 50
# Facts a summarizer is asked for in one answer (each costs output tokens, and the block
# shows a few of them): the newest of the messages it summarizes.
ASKED_FACTS = 10
# Reasons kept in Summary.facts_skipped; more are counted, not listed.
MAX_REASONS = 20

OPEN_TAG, CLOSE_TAG = "<facts>", "</facts>"

NOT_JSON = "The facts are not valid JSON ({error})."
TOO_DEEP = "The facts are nested too deeply to be read."
NOT_A_LIST = "The facts are not a JSON list of objects but {kind}."
NO_FACTS_BLOCK = "The answer has no <facts> block."
UNCLOSED_BLOCK = "The answer's <facts> block is not closed."
CUT_OFF = "The answer was cut off at the token cap before its facts ended."
NOT_STRUCTURED = "The answer is not the JSON object asked for; it is taken as a plain summary."
NO_FACTS_FIELD = "The answer's JSON has no facts list."
NOT_AN_OBJECT = "Fact {index} is not an object."
BAD_KEY = "Fact {index} has no key (a non-empty string)."
BAD_VALUE = "Fact {index} ({key}) has no value (a non-empty string or a number)."
BAD_SEQS = "Fact {index} ({key}) has no source_seqs (a list of message seqs)."
KEY_TOO_LONG = "Fact {index} ({key}…): the key is longer than {limit} characters."
VALUE_TOO_LONG = "Fact {index} ({key}): the value is longer than {limit} characters."
UNSTORABLE = (
    "Fact {index} ({key}): the value holds a character the database cannot store (a NUL or "
    "an unpaired surrogate)."
)
EMPTY = "Fact {key} has an empty key or value."
NO_SOURCE = "Fact {key} cites no message."
OUTSIDE = "Fact {key} cites seq {seqs}, outside the messages summarized."
TOO_MANY = "{count} facts beyond the first {limit} were dropped."
MORE_REASONS = "… and {count} more."


@dataclass(frozen=True, kw_only=True)
class ProposedFact:
    """A fact a summarizer proposes: ``key`` names what it is (``order_id``), ``value`` is
    the fact as the messages state it, ``source_seqs`` the seqs of those messages."""

    key: str
    value: str
    source_seqs: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Parsed:
    """Facts that passed, and why the others did not."""

    facts: tuple[ProposedFact, ...] = ()
    skipped: tuple[str, ...] = field(default_factory=tuple)


def one_line(text: str) -> str:
    """``text`` on one line with single spaces: how the facts block shows a value (a newline
    in it cannot pass for another fact's line), and what two values are compared by."""
    return " ".join(text.split())


def normalize_key(text: str) -> str:
    """A model's key in one spelling, so a later compaction's ``Order ID`` or ``order-id``
    finds the ``order_id`` an earlier one wrote: lower case, every run of characters other
    than letters and digits one underscore, none at the ends."""
    return re.sub(r"[\W_]+", "_", text.casefold()).strip("_")


def split_tagged(content: str) -> tuple[str, str | None, str]:
    """Split an answer written as a summary followed by ``<facts>`` JSON ``</facts>``:
    (summary, the block's text or None, why there is none). Text after the block belongs to
    the summary; a block that is not closed is left out of the summary all the same."""
    start = content.find(OPEN_TAG)
    if start < 0:
        return content.strip(), None, NO_FACTS_BLOCK
    before = content[:start]
    end = content.find(CLOSE_TAG, start + len(OPEN_TAG))
    if end < 0:
        return before.strip(), None, UNCLOSED_BLOCK
    after = content[end + len(CLOSE_TAG) :]
    summary = "\n\n".join(part.strip() for part in (before, after) if part.strip())
    return summary, content[start + len(OPEN_TAG) : end], ""


def facts_from_text(raw: str) -> Parsed:
    """The facts of a ``<facts>`` block: JSON, possibly inside a Markdown code fence."""
    text = raw.strip()
    fence = re.fullmatch(r"```[\w-]*\s*(.*?)\s*```", text, re.S)
    if fence:
        text = fence.group(1)
    try:
        value = _loads(text)
    except _TooDeep:
        return Parsed(skipped=(TOO_DEEP,))
    except ValueError as error:
        return Parsed(skipped=(NOT_JSON.format(error=error),))
    return facts_from_json(value)


def structured_answer(content: str) -> tuple[str | None, Parsed]:
    """The summary and facts of a structured answer, ``{"summary": …, "facts": [...]}``.

    An answer that is prose, not JSON (a server that ignored ``response_format``), is the
    summary with its facts skipped. One that starts as a JSON object but is not the object
    asked for has no summary that can be trusted: (None, …). One nested too deeply to be
    read keeps its summary when that comes first and whole (``salvaged_summary``).
    """
    text = content.strip()
    try:
        value = _loads(text)
    except _TooDeep:
        return salvaged_summary(text), Parsed(skipped=(TOO_DEEP,))
    except ValueError:
        if text.startswith("{"):
            return None, Parsed()
        return text, Parsed(skipped=(NOT_STRUCTURED,))
    summary = value.get("summary") if isinstance(value, dict) else None
    if not isinstance(summary, str) or not summary.strip():
        return None, Parsed()
    if "facts" not in value:
        return summary.strip(), Parsed(skipped=(NO_FACTS_FIELD,))
    return summary.strip(), facts_from_json(value["facts"])


def salvaged_summary(content: str) -> str | None:
    """The summary of a structured answer cut off at the token cap while writing its facts:
    the ``summary`` string when it is complete and followed by more fields, else None."""
    match = re.match(r'\s*\{\s*"summary"\s*:\s*', content)
    if match is None:
        return None
    try:
        summary, end = json.JSONDecoder().raw_decode(content, match.end())
    except (ValueError, RecursionError):
        return None
    rest = content[end:].lstrip()
    if not isinstance(summary, str) or not summary.strip() or not rest.startswith(","):
        return None
    return summary.strip()


class _TooDeep(ValueError):
    """JSON nested deeper than the parser recurses."""


def _loads(text: str) -> Any:
    """``json.loads``; JSON nested deeper than the parser recurses (a model's answer may be
    ``[[[[…``) raises ``_TooDeep``, a ValueError, instead of RecursionError."""
    try:
        return json.loads(text)
    except RecursionError as error:
        raise _TooDeep(str(error)) from error


def facts_from_json(value: Any) -> Parsed:
    """Facts from their JSON form: a list of ``{"key", "value", "source_seqs"}`` objects.
    An element of another shape is dropped; the rest stand. Keys are normalized
    (``normalize_key``), values put on one line; a number as value is taken as written."""
    if not isinstance(value, list):
        return Parsed(skipped=(NOT_A_LIST.format(kind=_kind(value)),))
    facts: list[ProposedFact] = []
    skipped: list[str] = []
    for index, item in enumerate(value, start=1):
        problem, fact = _fact(index, item)
        if fact is None:
            skipped.append(problem)
        else:
            facts.append(fact)
    return Parsed(facts=tuple(facts), skipped=tuple(skipped))


def _fact(index: int, item: Any) -> tuple[str, ProposedFact | None]:
    if not isinstance(item, dict):
        return NOT_AN_OBJECT.format(index=index), None
    raw_key = item.get("key")
    key = normalize_key(raw_key) if isinstance(raw_key, str) else ""
    if not key:
        return BAD_KEY.format(index=index), None
    if len(key) > MAX_KEY_CHARS:
        return KEY_TOO_LONG.format(index=index, key=key[:40], limit=MAX_KEY_CHARS), None
    raw_value = item.get("value")
    if isinstance(raw_value, int | float) and not isinstance(raw_value, bool):
        raw_value = json.dumps(raw_value)
    value = one_line(raw_value) if isinstance(raw_value, str) else ""
    if not value:
        return BAD_VALUE.format(index=index, key=key), None
    if len(value) > MAX_VALUE_CHARS:
        return VALUE_TOO_LONG.format(index=index, key=key, limit=MAX_VALUE_CHARS), None
    if unstorable(value):
        # One such value would fail the statement that stores every fact of the answer.
        return UNSTORABLE.format(index=index, key=key), None
    seqs = item.get("source_seqs")
    if not isinstance(seqs, list) or not all(
        isinstance(seq, int) and not isinstance(seq, bool) for seq in seqs
    ):
        return BAD_SEQS.format(index=index, key=key), None
    return "", ProposedFact(key=key, value=value, source_seqs=tuple(sorted(set(seqs))))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def facts_checked(facts: Iterable[ProposedFact], allowed_seqs: Collection[int]) -> Parsed:
    """The facts that cite only messages in ``allowed_seqs`` (the messages the summary
    covers), at least one, with a key and a value: one per key, a later one replacing an
    earlier one (the same value twice joins their seqs), at most ``MAX_FACTS``."""
    kept: dict[str, ProposedFact] = {}
    skipped: list[str] = []
    for fact in facts:
        if not fact.key or not fact.value:
            skipped.append(EMPTY.format(key=fact.key or "?"))
            continue
        if not fact.source_seqs:
            skipped.append(NO_SOURCE.format(key=fact.key))
            continue
        outside = [seq for seq in fact.source_seqs if seq not in allowed_seqs]
        if outside:
            seqs = ", ".join(str(seq) for seq in outside[:5])
            skipped.append(OUTSIDE.format(key=fact.key, seqs=seqs))
            continue
        earlier = kept.pop(fact.key, None)
        if earlier is not None and earlier.value == fact.value:
            seqs_joined = tuple(sorted({*earlier.source_seqs, *fact.source_seqs}))
            fact = ProposedFact(key=fact.key, value=fact.value, source_seqs=seqs_joined)
        kept[fact.key] = fact
    facts_kept = list(kept.values())
    if len(facts_kept) > MAX_FACTS:
        skipped.append(TOO_MANY.format(count=len(facts_kept) - MAX_FACTS, limit=MAX_FACTS))
        facts_kept = facts_kept[:MAX_FACTS]
    return Parsed(facts=tuple(facts_kept), skipped=tuple(skipped))


def skipped_text(reasons: Sequence[str]) -> str:
    """Reasons as ``Summary.facts_skipped`` keeps them: one a line, each once, the first
    ``MAX_REASONS``."""
    unique = list(dict.fromkeys(reason for reason in reasons if reason))
    lines = unique[:MAX_REASONS]
    if len(unique) > MAX_REASONS:
        lines.append(MORE_REASONS.format(count=len(unique) - MAX_REASONS))
    return "\n".join(lines)
