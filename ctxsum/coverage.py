"""The coverage check: which facts of the covered messages (e-mail addresses, amounts, dates,
identifiers, numbers, proper names) a summary still holds, compared without case, numbers by
their value. A reviewer's aid, not a verdict (docs/architecture.md, "The coverage check").
Pure: no ORM, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december|"
    "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|"
    "enero|febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|setiembre|octubre|"
    "noviembre|diciembre|"
    "janvier|février|fevrier|mars|avril|mai|juin|juillet|août|aout|septembre|octobre|"
    "novembre|décembre|decembre|"
    "januar|februar|märz|maerz|juni|juli|oktober|dezember"
)
_WEEKDAYS = (
    "monday|tuesday|wednesday|thursday|friday|saturday|sunday|"
    "lunes|martes|miércoles|jueves|viernes|sábado|domingo|"
    "lundi|mardi|mercredi|jeudi|vendredi|samedi|dimanche|"
    "montag|dienstag|mittwoch|donnerstag|freitag|samstag|sonntag"
)
_NUMBER = r"\d{1,3}(?:[,.]\d{3})+(?:[.,]\d+)?|\d+(?:[.,]\d+)?"
# The decimals of a number: a separator, then other than three digits, at its end.
_DECIMALS = re.compile(r"[.,](\d{1,2}|\d{4,})$")
_CURRENCY = r"[$€£¥₹]|\b(?:USD|EUR|GBP|JPY|INR|MXN|PEN|CAD|AUD|CHF)\b"

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("email", re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")),
    ("amount", re.compile(rf"(?:{_CURRENCY})\s?(?:{_NUMBER})|(?:{_NUMBER})\s?(?:{_CURRENCY})")),
    (
        "date",
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b"
            rf"|\b(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b"
            rf"|\b\d{{1,2}}(?:st|nd|rd|th|er|\.)?\s+(?:de\s+)?(?:{_MONTHS})\b",
            re.IGNORECASE,
        ),
    ),
    (
        "identifier",
        re.compile(
            r"#\d+\b|\b\d+(?:-\d+)+\b"
            r"|\b(?=[\w-]*\d)(?=[\w-]*[^\W\d])[^\W_][\w]*(?:[-_#][\w]+)*\b"
        ),
    ),
    ("number", re.compile(rf"\b(?:{_NUMBER})\b")),
)
# A word of letters (any alphabet), with inner apostrophes or hyphens: O'Neil, Jean-Luc.
_WORD = re.compile(r"[^\W\d_]+(?:['\u2019-][^\W\d_]+)*")
# "I" and its contractions (I'd, I'm, I'll, I've) are capitalised without being names.
_NOT_NAMES = re.compile(
    rf"^(?:i(?:['\u2019](?:d|m|ll|ve))?|ok|okay|{_MONTHS}|{_WEEKDAYS})$", re.IGNORECASE
)
# What may stand before the first word of a sentence (spaces and tabs skipped).
_SENTENCE_BREAKS = frozenset('.!?¡¿:;\n"“(*#-•')


@dataclass(frozen=True, kw_only=True)
class Fact:
    kind: str
    text: str
    present: bool


@dataclass(frozen=True, kw_only=True)
class Coverage:
    """The facts found in the covered messages, in the order first seen."""

    facts: tuple[Fact, ...]

    @property
    def ratio(self) -> float | None:
        """Share of the facts the summary holds; None when there was nothing to find."""
        if not self.facts:
            return None
        return sum(fact.present for fact in self.facts) / len(self.facts)

    @property
    def missing(self) -> list[Fact]:
        return [fact for fact in self.facts if not fact.present]

    def as_json(self) -> list[dict[str, Any]]:
        return [{"kind": f.kind, "text": f.text, "present": f.present} for f in self.facts]


def message_texts(messages: Iterable[Mapping[str, Any]]) -> list[str]:
    """The texts of OpenAI chat messages that facts are looked for in."""
    texts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, Sequence):
            texts.extend(
                str(part.get("text") or part.get("refusal") or "")
                for part in content
                if isinstance(part, Mapping)
            )
        for call in message.get("tool_calls") or ():
            texts.append(str(call.get("function", {}).get("arguments") or ""))
        if isinstance(message.get("refusal"), str):
            texts.append(message["refusal"])
    return [text for text in texts if text]


def facts_found(
    texts: Iterable[str], known: Iterable[tuple[str, str]] = ()
) -> list[tuple[str, str]]:
    """(kind, text) of every fact in ``texts``, each once, in the order first seen, after
    the ``known`` facts; a span is claimed by the first kind that matches it."""
    found = {fact_key(kind, fact): (kind, fact) for kind, fact in known}
    for text in texts:
        for kind, fact in _facts_of(text):
            found.setdefault(fact_key(kind, fact), (kind, fact))
    return list(found.values())


def _facts_of(text: str) -> list[tuple[str, str]]:
    taken = [False] * len(text)
    spans: list[tuple[int, str, str]] = []
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            start, end = match.span()
            if any(taken[start:end]):
                continue
            if kind == "number" and len(re.sub(r"\D", "", match.group())) < 2:
                continue
            taken[start:end] = [True] * (end - start)
            spans.append((start, kind, match.group().strip()))
    for start, name in _names(text):
        if not any(taken[start : start + len(name)]):
            spans.append((start, "name", name))
    return [(kind, fact) for _, kind, fact in sorted(spans)]


def _names(text: str) -> list[tuple[int, str]]:
    """Runs of capitalised words (one space apart), less a sentence's first word and the
    function words that are capitalised anyway."""
    runs: list[list[re.Match[str]]] = []
    for match in _WORD.finditer(text):
        word = match.group()
        if not word[0].isupper() or _NOT_NAMES.match(word):
            continue
        if not (runs and text[runs[-1][-1].end() : match.start()] == " "):
            if _starts_sentence(text, match.start()):
                continue
            runs.append([])
        runs[-1].append(match)
    return [(run[0].start(), text[run[0].start() : run[-1].end()]) for run in runs]


def _starts_sentence(text: str, start: int) -> bool:
    index = start - 1
    while index >= 0 and text[index] in " \t":
        index -= 1
    return index < 0 or text[index] in _SENTENCE_BREAKS


def fact_key(kind: str, fact: str) -> str:
    """What two mentions of a fact share: the value of a number or an amount (1,200 is
    1200), else the text without case and spacing. Stable: the offline summarizer keys by it."""
    if kind in ("number", "amount"):
        return f"{kind}:{_value(fact)}"
    return f"{kind}:{' '.join(fact.casefold().split())}"


def _value(number: str) -> str:
    """A number's digits, its decimals after a point and without trailing zeros; a comma
    or point followed by three digits groups thousands."""
    number = re.sub(r"[^\d.,]", "", number)
    decimals = _DECIMALS.search(number)
    if decimals is None:
        return re.sub(r"\D", "", number)
    whole = re.sub(r"\D", "", number[: decimals.start()])
    fraction = decimals.group(1).rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


def coverage(covered: Iterable[str], summary: str) -> Coverage:
    """Which facts of the ``covered`` texts the ``summary`` text holds."""
    return facts_checked(facts_found(covered), summary)


def facts_checked(found: Iterable[tuple[str, str]], summary: str) -> Coverage:
    """Which of the ``found`` facts the ``summary`` text holds."""
    folded = " ".join(summary.casefold().split())
    numbers = {_value(match.group()) for match in re.finditer(_NUMBER, summary)}
    facts = []
    for kind, fact in found:
        if kind in ("number", "amount"):
            present = _value(fact) in numbers
        else:
            present = " ".join(fact.casefold().split()) in folded
        facts.append(Fact(kind=kind, text=fact, present=present))
    return Coverage(facts=tuple(facts))
