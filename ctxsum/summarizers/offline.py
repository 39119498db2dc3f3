"""The offline summarizer: no network, no configuration, the same summary for the same input;
for development, demos and tests."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from ctxsum import coverage
from ctxsum.exceptions import SummarizerError
from ctxsum.hooks import summary_facts_wanted
from ctxsum.summarizers.base import BLANK_INPUT, Summarizer, SummaryAnswer
from ctxsum.summarizers.facts import ASKED_FACTS, MAX_KEY_CHARS, MAX_VALUE_CHARS, ProposedFact
from ctxsum.tokens import count_text, encoding_for

# What an offline summary records as its model (Summary.model): no model ran.
OFFLINE_MODEL = "offline"
MAX_SENTENCE_CHARS = 300
MAX_ARGUMENT_CHARS = 80
MAX_RESULT_CHARS = 200
MAX_RESULT_SENTENCES = 3

_ATTRS = r'((?:\s+[\w-]+="[^"]*")*)'
_SUMMARY_SO_FAR = re.compile(r"<summary-so-far\s*>(.*?)</summary-so-far\s*>", re.S)
_BLOCK = re.compile(r"<([a-z][\w-]*)" + _ATTRS + r"\s*>(.*?)</\1\s*>", re.S)
_TOOL_CALL = re.compile(r"<tool-call" + _ATTRS + r"\s*>(.*?)</tool-call\s*>", re.S)
_ATTR = re.compile(r'([\w-]+)="([^"]*)"')
_STRAY_TAG = re.compile(r"</?[a-z][\w-]*" + _ATTRS + r"\s*/?>")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?…])\s+|\s*\n\s*")
_BULLET = re.compile(r"^(?:[-*•]|\d+[.)])\s+")
_WORD = re.compile(r"\w[\w'\u2019-]*")

# What makes a sentence worth keeping: a digit (amounts, dates, times, codes), an
# identifier-looking token, a decision or commitment, or a capitalised word that is not
# just an ordinary sentence opener (names, places, products, months).
_DIGIT = re.compile(r"\d")
_IDENTIFIER = re.compile(r"@|https?://|www\.|#\w|\w_\w|\b[A-Z]{2,}\b")
_DECISION = re.compile(
    r"\b(?:agree\w*|decid\w*|decision\w*|confirm\w*|book(?:s|ed|ing)?|cancel\w*|will|"
    r"won't|must|shall|need(?:s|ed)?|requir\w*|approv\w*|reject\w*|chose|chosen|choose|"
    r"select\w*|prefer\w*|want(?:s|ed)?|deadline\w*|schedul\w*|order(?:s|ed)?|paid|"
    r"pay(?:s|ing|ment)?|refund\w*|pending|promis\w*|accept\w*|declin\w*|reserv\w*|"
    r"assign\w*|deliver\w*|ship(?:s|ped|ping)?|plan(?:s|ned)?|going to|go(?:ing)? with|"
    r"should|never|always|allerg\w*|budget)\b",
    re.IGNORECASE,
)
_COMMON_WORDS = """
    a about after again all also alright an and any are as at be because before but by can
    could did do does done for from good got great he hello her here hey hi his how i i'd
    i'll i'm i've if in is it it's its just let let's maybe me my no not now of oh ok okay
    on one or our perfect please right she so some sorry sounds sure thank thanks that
    that's the their then there these they this those to uh um up us was we we'll we're
    well were what when where which while who why with would yes yeah yet you you'll
    you're your
"""
_COMMON_CAPITALISED = frozenset(_COMMON_WORDS.split())
# What the coverage check finds that is a key fact: not plain numbers, too many to matter.
FACT_KINDS = ("email", "amount", "date", "identifier", "name")

# A block's label is its role capitalised; text outside any tag is a note.
_LABELS = {"text": "Note"}


@dataclass(frozen=True, kw_only=True)
class _Block:
    role: str
    text: str
    name: str = ""
    calls: tuple[tuple[str, str], ...] = ()
    seq: int | None = None  # the message's seq, when the history names it


@dataclass(frozen=True, kw_only=True)
class _Unit:
    """One kept sentence; consecutive units of a group render on one line."""

    group: int
    prefix: str
    text: str


class OfflineSummarizer(Summarizer):
    """An EXTRACTIVE, deterministic summarizer that never leaves the process.

    It parses the formatted history (role tags, tool calls and results, an optional
    ``<summary-so-far>``) and keeps, in order, the sentences that carry names, numbers,
    dates, identifiers or decisions, and every tool call with short arguments. A previous
    summary is kept and the new facts appended; when over the budget the oldest lines go
    first. If no sentence qualifies, the first sentence of each user message is kept, so a
    non-blank history never yields a blank summary. The prompt is ignored, and so are options.

    Key facts (``answer``): the ``FACT_KINDS`` the coverage check finds in the messages whose
    seq the history names, keyed ``kind:value`` as the check compares them, so that every
    compaction finds the same key for the same fact (``identifier:ai-101``, ``amount:1200``).
    """

    requires_network: ClassVar[bool] = False
    deterministic: ClassVar[bool] = True

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        self.require_history(history)
        previous, blocks = _parse(history)
        units = _previous_units(previous) + _fact_units(blocks)
        if not units:
            raise SummarizerError(BLANK_INPUT)
        return self._fit(units, max(min(int(budget), int(self.max_tokens)), 1), model)

    def answer(self, *, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        # summarize() writes the text (a subclass may write it otherwise); the facts come
        # from the history itself, when an installed app takes them.
        text = self.summarize(prompt=prompt, history=history, model=model, budget=budget)
        facts = _key_facts(_parse(history)[1]) if summary_facts_wanted() else ()
        return SummaryAnswer(summary=text, facts=facts, model=OFFLINE_MODEL)

    def _fit(self, units: list[_Unit], budget: int, model: str) -> str:
        """Render the newest units that fit in ``budget`` tokens, dropping the oldest first."""
        costs = []
        for index, unit in enumerate(units):
            cost = count_text(unit.text, model=model) + 1
            if index == 0 or units[index - 1].group != unit.group:
                cost += count_text(unit.prefix, model=model)
            costs.append(cost)
        start, total = 0, sum(costs)
        while total > budget and start < len(units) - 1:
            total -= costs[start]
            start += 1
        # The estimate ignores tokenizer merges across joins: confirm on the real text.
        text = _render(units[start:])
        while count_text(text, model=model) > budget and start < len(units) - 1:
            start += 1
            text = _render(units[start:])
        if count_text(text, model=model) > budget:
            text = self._truncate(text, budget, model)
        return text.strip()

    def _truncate(self, text: str, budget: int, model: str) -> str:
        encoding = encoding_for(model)
        tokens = encoding.encode(text, disallowed_special=())
        for keep in range(budget - 1, 0, -1):
            candidate = encoding.decode(tokens[:keep]).rstrip().rstrip("\ufffd") + "…"
            if candidate.strip("…") and count_text(candidate, model=model) <= budget:
                return candidate
        return encoding.decode(tokens[:budget]) or text[:1]


def _parse(history: str) -> tuple[str, list[_Block]]:
    """The summary so far and the message blocks, in order; text outside any tag is a
    "text" block, so plain text still works."""
    previous = ""
    match = _SUMMARY_SO_FAR.search(history)
    if match:
        previous = _unescape(match.group(1))
        history = history[: match.start()] + history[match.end() :]
    blocks: list[_Block] = []
    position = 0
    for match in _BLOCK.finditer(history):
        _add_stray_text(blocks, history[position : match.start()])
        position = match.end()
        tag, attrs, body = match.group(1), _attributes(match.group(2)), match.group(3)
        seq = int(attrs["seq"]) if attrs.get("seq", "").isdigit() else None
        if tag == "tool-call":
            call = (attrs.get("name", ""), body)
            blocks.append(_Block(role="assistant", text="", calls=(call,), seq=seq))
        elif tag == "tool-result":
            name = attrs.get("name", "")
            blocks.append(_Block(role="tool", text=_unescape(body), name=name, seq=seq))
        else:
            calls = tuple(
                (_attributes(call.group(1)).get("name", ""), call.group(2))
                for call in _TOOL_CALL.finditer(body)
            )
            text = _unescape(_TOOL_CALL.sub(" ", body))
            blocks.append(_Block(role=tag, text=text, calls=calls, seq=seq))
    _add_stray_text(blocks, history[position:])
    return previous, blocks


def _add_stray_text(blocks: list[_Block], text: str) -> None:
    text = _unescape(_STRAY_TAG.sub(" ", text))
    if text.strip():
        blocks.append(_Block(role="text", text=text))


def _attributes(text: str) -> dict[str, str]:
    return {key: html.unescape(value) for key, value in _ATTR.findall(text)}


def _unescape(text: str) -> str:
    return html.unescape(text).strip()


def _previous_units(previous: str) -> list[_Unit]:
    """The summary so far, sentence by sentence, each line keeping its bullet."""
    lines = previous.splitlines()
    units: list[_Unit] = []
    for group, line in enumerate(lines, start=-len(lines)):
        line = line.strip()
        bullet = _BULLET.match(line)
        prefix = bullet.group(0) if bullet else ""
        sentences = _sentences(line[len(prefix) :], clip=0)
        units.extend(_Unit(group=group, prefix=prefix, text=sentence) for sentence in sentences)
    return units


def _fact_units(blocks: list[_Block]) -> list[_Unit]:
    units: list[_Unit] = []
    seen: set[str] = set()
    for group, block in enumerate(blocks):
        if block.role == "tool":
            prefix = f"- {block.name or 'Tool'} returned: "
            facts = [s for s in _sentences(block.text, clip=MAX_RESULT_CHARS) if _carries_fact(s)]
            facts = facts[:MAX_RESULT_SENTENCES]
        else:
            prefix = f"- {_LABELS.get(block.role, block.role.capitalize())}: "
            facts = [s for s in _sentences(block.text) if _carries_fact(s)]
        for sentence in facts:
            key = " ".join(sentence.casefold().split())
            if key not in seen:
                seen.add(key)
                units.append(_Unit(group=group * 1000, prefix=prefix, text=sentence))
        for offset, (name, arguments) in enumerate(block.calls, start=1):
            arguments = _clip(" ".join(_unescape(arguments).split()), MAX_ARGUMENT_CHARS)
            call = f"{name or 'tool'}({arguments})"
            units.append(_Unit(group=group * 1000 + offset, prefix="- Called ", text=call))
    if units:
        return units
    # Nothing qualified: keep the first sentence of each user message (of each message,
    # when there is no user message) rather than return nothing.
    for role in ("user", None):
        for group, block in enumerate(blocks):
            if role is None or block.role == role:
                first = next(_sentences(block.text), None)
                if first:
                    label = _LABELS.get(block.role, block.role.capitalize())
                    units.append(_Unit(group=group * 1000, prefix=f"- {label}: ", text=first))
        if units:
            break
    return units


def _key_facts(blocks: list[_Block]) -> tuple[ProposedFact, ...]:
    """The key facts of the blocks that name their message's seq: one per ``kind:value``
    key, its text as first written, the seqs of every message that holds it; the
    ``ASKED_FACTS`` mentioned last, in the order first seen."""
    values: dict[str, str] = {}
    sources: dict[str, set[int]] = {}
    recent: dict[str, None] = {}  # the keys by their latest mention, the oldest first
    for block in blocks:
        if block.seq is None:
            continue  # a fact must cite its message
        texts = [block.text, *(_unescape(arguments) for _, arguments in block.calls)]
        for kind, text in coverage.facts_found(texts):
            key = coverage.fact_key(kind, text)
            if kind not in FACT_KINDS or len(key) > MAX_KEY_CHARS or len(text) > MAX_VALUE_CHARS:
                continue
            values.setdefault(key, " ".join(text.split()))
            sources.setdefault(key, set()).add(block.seq)
            recent.pop(key, None)
            recent[key] = None
    latest = set(list(recent)[-ASKED_FACTS:])
    return tuple(
        ProposedFact(key=key, value=value, source_seqs=tuple(sorted(sources[key])))
        for key, value in values.items()
        if key in latest
    )


def _sentences(text: str, clip: int = MAX_SENTENCE_CHARS) -> Iterator[str]:
    for piece in _SENTENCE_BREAK.split(text):
        sentence = _BULLET.sub("", " ".join(piece.split()))
        if sentence:
            yield _clip(sentence, clip) if clip else sentence


def _carries_fact(sentence: str) -> bool:
    if _DIGIT.search(sentence) or _IDENTIFIER.search(sentence) or _DECISION.search(sentence):
        return True
    return any(
        word[0].isupper() and word.casefold().replace("\u2019", "'") not in _COMMON_CAPITALISED
        for word in _WORD.findall(sentence)
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _render(units: list[_Unit]) -> str:
    lines: list[str] = []
    group: int | None = None
    for unit in units:
        if lines and unit.group == group:
            lines[-1] += " " + unit.text
        else:
            lines.append(unit.prefix + unit.text)
        group = unit.group
    return "\n".join(lines)
