"""Writing a summary: what the summarizer is told, and how every archived message reaches it.
No database writes: the compaction commits what it wrote.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import asdict, dataclass
from functools import partial

from django.utils.translation import gettext_lazy as _

from ctxsum import coverage, formatting, tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.coverage import Coverage
from ctxsum.exceptions import FailureCause, SummarizerError
from ctxsum.hooks import summary_facts_wanted
from ctxsum.models import Conversation, Message, Summary
from ctxsum.policy import MIN_SUMMARY_BUDGET
from ctxsum.selectors import summary_message
from ctxsum.summarizers import facts as fact_parse
from ctxsum.summarizers import get_summarizer
from ctxsum.summarizers.base import BLANK_SUMMARY, Summarizer, SummaryAnswer
from ctxsum.summarizers.facts import ASKED_FACTS, ProposedFact

# Room kept in every summarizer call for the summary so far and the instruction's framing.
MIN_CHUNK_BUDGET = 256
BUDGET_TOO_SMALL = _(
    "SUMMARY_INPUT_BUDGET leaves {budget} tokens for history after the prompt and the "
    "summary so far; raise it."
)
# Tokens of one key fact in a summarizer's answer, about: {"key": …, "value": …,
# "source_seqs": […]} with a short key and value.
FACT_ANSWER_TOKENS = 20
# And as a line of the facts block ("- key: value"), about.
FACT_LINE_TOKENS = 8
# Told to the model after the prompt: the summary's length budget for this compaction.
LENGTH_BUDGET = "Keep the summary under {tokens} tokens (about {words} words)."
# Before the reasons of a call when a summary took several.
CHUNK_REASON = "Call {index} of {count}: {reason}"


@dataclass(frozen=True, kw_only=True)
class Written:
    """A summary the summarizer wrote, not stored yet."""

    text: str
    model: str
    token_count: int  # of the summary as a context message
    input_tokens: int
    output_tokens: int
    latency_ms: int
    # The key facts the calls proposed, and why any were skipped (Summary.facts_skipped).
    facts: tuple[ProposedFact, ...] = ()
    facts_skipped: str = ""


def summary_model(conversation: Conversation) -> str:
    """The model that writes the conversation's summaries: SUMMARY_MODEL, else its own."""
    return ctxsum_settings.SUMMARY_MODEL or conversation.model or ctxsum_settings.DEFAULT_MODEL


def summary_prompt(budget: int, facts_instruction: str = "") -> str:
    """PROMPT, the backend's facts instruction, then this summary's length budget."""
    length = LENGTH_BUDGET.format(tokens=budget, words=budget * 3 // 4)
    parts = [ctxsum_settings.PROMPT, facts_instruction, length]
    return "\n\n".join(part for part in parts if part)


def history_room(prompt: str, count: Callable[[str], int]) -> int:
    """Tokens of history one summarizer call can take beside ``prompt`` and the answer."""
    return ctxsum_settings.SUMMARY_INPUT_BUDGET - count(prompt) - ctxsum_settings.SUMMARY_MAX_TOKENS


def summary_size(text: str, conversation: Conversation) -> int:
    """Tokens of a summary's text as the context message it becomes."""
    return tokens.count_message(summary_message(text), model=conversation.model or None)


def payoff_sizing(conversation: Conversation) -> tuple[int | None, int]:
    """What a compaction's ``Payoff`` counts besides the history and the summary (``Sizing``'s
    fields; None with REQUIRE_PAYOFF off): ``prompt_tokens``, a summarizer call's instruction
    as a system message, the history's message framing, and the key facts of its answer when
    an app takes them (``ASKED_FACTS`` at ``FACT_ANSWER_TOKENS``); ``blocks_growth``, the
    tokens those facts then add to the facts block of every later call (at most
    FACTS_MAX_TOKENS)."""
    if not ctxsum_settings.REQUIRE_PAYOFF:
        return None, 0
    instruction = get_summarizer().facts_instruction() if summary_facts_wanted() else ""
    prompt = summary_prompt(MIN_SUMMARY_BUDGET, instruction)
    facts = ASKED_FACTS if instruction else 0
    overhead = _call_overhead(prompt, conversation.model or None) + facts * FACT_ANSWER_TOKENS
    return overhead, min(facts * FACT_LINE_TOKENS, ctxsum_settings.FACTS_MAX_TOKENS)


@functools.lru_cache(maxsize=64)
def _call_overhead(prompt: str, model: str | None) -> int:
    sent = [{"role": "system", "content": prompt}, {"role": "user", "content": ""}]
    return tokens.context_tokens(tokens.count_message(message, model=model) for message in sent)


@dataclass(frozen=True, kw_only=True)
class SummaryCall:
    """One summarizer call of a summary: ``Summarizer.answer()``'s arguments."""

    prompt: str
    history: str
    model: str
    budget: int


# A summary's writing, without its calls: yields each call, is sent its answer, and returns
# what was written (``summary_steps``).
Steps = Generator[SummaryCall, SummaryAnswer, Written]


def summary_write(
    conversation: Conversation,
    previous: Summary | None,
    archived: Sequence[Message],
    *,
    budget: int,
    before_call: Callable[[], None],
) -> Written:
    """The new summary from ``previous`` plus ``archived``, in as many calls as the input
    budget needs; ``before_call`` runs before every call but the first."""
    summarizer = get_summarizer()
    steps = summary_steps(conversation, previous, archived, budget=budget, summarizer=summarizer)
    call = next(steps)
    while True:
        try:
            call = steps.send(summarizer.answer(**asdict(call)))
        except StopIteration as done:
            written: Written = done.value
            return written
        before_call()


async def asummary_write(
    conversation: Conversation,
    previous: Summary | None,
    archived: Sequence[Message],
    *,
    budget: int,
    before_call: Callable[[], Awaitable[None]],
) -> Written:
    """``summary_write`` with the summarizer's ``aanswer()``: the same steps, awaited; run
    from the event loop (the steps read no database)."""
    summarizer = get_summarizer()
    steps = summary_steps(conversation, previous, archived, budget=budget, summarizer=summarizer)
    call = next(steps)
    while True:
        try:
            call = steps.send(await summarizer.aanswer(**asdict(call)))
        except StopIteration as done:
            written: Written = done.value
            return written
        await before_call()


def summary_steps(
    conversation: Conversation,
    previous: Summary | None,
    archived: Sequence[Message],
    *,
    budget: int,
    summarizer: Summarizer,
) -> Steps:
    """Writing the new summary from ``previous`` plus ``archived``: the calls the input
    budget needs (``SummaryCall``), each answer checked, the summary so far carried to the
    next call, and the facts of all of them merged into the ``Written`` returned."""
    model = summary_model(conversation)
    prompt = summary_prompt(budget, summarizer.facts_instruction())
    count = partial(tokens.count_text, model=conversation.model or None)
    room = history_room(prompt, count)
    if room < MIN_CHUNK_BUDGET:
        raise SummarizerError(BUDGET_TOO_SMALL.format(budget=room))
    seqs = [row.seq for row in archived]
    chunks = formatting.chunk_history(
        [row.as_openai() for row in archived], budget=room, count=count, seqs=seqs
    )
    text = previous.text if previous else None
    facts: list[ProposedFact] = []
    skipped: list[list[str]] = []  # per call
    input_tokens = output_tokens = 0
    started = time.monotonic()
    answered = model  # the model that wrote the summary, as the backend reports it
    for chunk in chunks:
        history = formatting.with_summary_so_far(text, chunk)
        answer = yield SummaryCall(prompt=prompt, history=history, model=model, budget=budget)
        if not answer.summary or not answer.summary.strip():
            raise SummarizerError(BLANK_SUMMARY, kind=FailureCause.BAD_ANSWER)
        text = answer.summary.strip()
        answered = answer.model or answered
        input_tokens += count(prompt) + count(history)
        output_tokens += count(text)
        # Facts may cite any message the summary covers; each call's later facts win.
        checked = fact_parse.facts_checked(answer.facts, allowed_seqs=set(seqs))
        facts.extend(checked.facts)
        skipped.append([*answer.facts_skipped, *checked.skipped])
    assert text is not None  # chunk_history returns at least one chunk for a non-empty list
    merged = fact_parse.facts_checked(facts, allowed_seqs=set(seqs))
    return Written(
        text=text,
        model=answered[: Summary._meta.get_field("model").max_length],
        token_count=summary_size(text, conversation),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        latency_ms=int((time.monotonic() - started) * 1000),
        facts=merged.facts,
        facts_skipped=fact_parse.skipped_text([*_reasons(skipped), *merged.skipped]),
    )


def _reasons(per_call: list[list[str]]) -> list[str]:
    """The reasons of every call: one every call gave once, the others with their call."""
    if len(per_call) == 1:
        return per_call[0]
    shared = set.intersection(*(set(reasons) for reasons in per_call))
    reasons = [reason for reason in per_call[0] if reason in shared]
    for index, call in enumerate(per_call):
        reasons.extend(
            CHUNK_REASON.format(index=index + 1, count=len(per_call), reason=reason)
            for reason in call
            if reason not in shared
        )
    return reasons


def summary_coverage(previous: Summary | None, archived: Sequence[Message], text: str) -> Coverage:
    """The coverage check of ``text`` against what its summarizer was given: the facts the
    summary so far (``previous``) held, then those of the newly ``archived`` messages. A
    fact ``previous`` had lost is not looked for again (the summarizer never saw it) unless
    an archived message mentions it anew; so the check, and the row that stores it, are as
    large as one summary and one batch of messages, however long the conversation."""
    known = held_facts(previous) if previous is not None else []
    texts = coverage.message_texts(row.as_openai() for row in archived)
    return coverage.facts_checked(coverage.facts_found(texts, known), text)


def held_facts(summary: Summary) -> list[tuple[str, str]]:
    """(kind, text) of the facts ``summary`` held: those its coverage check found present,
    or, for a summary stored without one (written before ctxsum kept it), those of its
    text."""
    if summary.coverage_facts is None:
        return coverage.facts_found([summary.text])
    return [(fact["kind"], fact["text"]) for fact in summary.coverage_facts if fact["present"]]
