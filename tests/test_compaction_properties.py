"""Properties of compaction over random conversations, checked against the database.

Random conversations (an optional leading system or developer message, user and assistant
turns, assistant messages with 1-5 parallel tool calls followed by their results, call ids
reused across messages, assistant content null beside tool calls) are appended in random
batches under every kind of policy, with a compaction attempted after every append (some
forced, some dry runs). After every step the invariants of tests/invariants.py hold. A
summarizer that fails, in any way, leaves the conversation exactly as it was.

Rows of earlier examples stay in the test transaction: every example makes its own user and
conversation and every assertion is scoped to that conversation.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.test import override_settings
from hypothesis import HealthCheck, assume, event, given, target
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ctxsum.exceptions import SummarizerError
from ctxsum.facts.block import FACTS_BLOCK
from ctxsum.models import CompactionAttempt, Conversation, Summary
from ctxsum.policy import PINNED_MAX, Reason
from ctxsum.selectors import ActiveContext, context_get, transcript_list
from ctxsum.services.compaction import CompactionResult, conversation_compact
from ctxsum.services.conversations import conversation_create, conversation_update
from ctxsum.services.messages import message_append
from ctxsum.services.revert import conversation_revert
from ctxsum.summarizers.offline import OfflineSummarizer
from ctxsum.validation import TOOL_CALL_ID_ARCHIVED
from tests.factories import (
    OFFLINE_SUMMARIZER,
    assistant_calls,
    assistant_message,
    tool_call,
    tool_result,
    user_message,
)
from tests.invariants import assert_context_invariants
from tests.openai_server import FakeOpenAI, running_fake_openai
from tests.profiles import examples

OPENAI = "ctxsum.summarizers.openai.OpenAISummarizer"
# The default prompt with its length-budget line: a budget below it + 256 is refused.
PROMPT_TOKENS = 213 + 15

# Full size in the ci profile (tests/profiles.py).
PROPERTY_SETTINGS = hypothesis_settings(
    deadline=None,
    max_examples=examples(80),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

WORDS_TEXT = (
    "the flight to Delhi on October 20 costs 340 EUR and we agreed to book it "
    "please check weather in Mumbai tomorrow morning user wants a window seat budget "
    "is tight the hotel near MG Road has 4 stars order #A-1142 shipped yesterday "
    "call me at 10:30 refund pending ok thanks sounds good maybe later"
)
WORDS = tuple(WORDS_TEXT.split())
CALL_IDS = tuple(f"call_{index}" for index in range(7))
TOOLS = ("get_weather", "search_flights", "book_hotel", "lookup_order")


def _text(words: list[str]) -> str:
    return " ".join(words).capitalize() + "."


texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=40).map(_text)


@st.composite
def conversations(draw: st.DrawFn, min_turns: int = 1, max_turns: int = 12) -> list[dict]:
    """A valid message list in the normalized form the API stores and returns."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        role = draw(st.sampled_from(["system", "system", "developer"]))
        messages.append({"role": role, "content": draw(texts)})
    for _ in range(draw(st.integers(min_turns, max_turns))):
        kind = draw(st.sampled_from(["user", "user", "assistant", "tools", "tools", "note"]))
        if kind == "user":
            messages.append(user_message(draw(texts)))
        elif kind == "assistant":
            messages.append(assistant_message(draw(texts)))
        elif kind == "note":  # a system/developer message inside the history: summarizable
            role = draw(st.sampled_from(["system", "developer", "user"]))
            messages.append({"role": role, "content": draw(texts)})
        else:
            ids = draw(st.lists(st.sampled_from(CALL_IDS), min_size=1, max_size=5, unique=True))
            calls = [
                tool_call(
                    call_id,
                    draw(st.sampled_from(TOOLS)),
                    json.dumps({"q": draw(st.sampled_from(WORDS))}),
                )
                for call_id in ids
            ]
            content = draw(st.one_of(st.none(), texts))
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            for call_id in draw(st.permutations(ids)):
                messages.append(tool_result(call_id, draw(texts)))
    return messages


@st.composite
def policies(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int], int | None]:
    """A valid (trigger, keep, max_context_tokens): keep below the trigger whenever they share
    a unit, and a message trigger above keep plus every pinned message (the system message,
    the summary, the key facts block)."""
    unit = draw(st.sampled_from(["messages", "tokens"]))
    kept = draw(st.integers(1, 8)) if unit == "messages" else draw(st.integers(1, 300))
    trigger: dict[str, int] = {}
    units = draw(st.sampled_from([("messages",), ("tokens",), ("messages", "tokens")]))
    if "messages" in units:
        low = kept + PINNED_MAX + 1 if unit == "messages" else 2
        trigger["messages"] = draw(st.integers(low, max(low, 14)))
    if "tokens" in units:
        low = max(40, kept + 1) if unit == "tokens" else 40
        trigger["tokens"] = draw(st.integers(low, 600))
    ceiling = draw(st.none() | st.none() | st.integers(60, 900))
    return trigger, {unit: kept}, ceiling


def _ctxsum(**overrides: Any) -> dict[str, Any]:
    return {**getattr(settings, "CTXSUM", {}), **overrides}


def _new_conversation(
    trigger: dict[str, int], keep: dict[str, int], ceiling: int | None = None
) -> Conversation:
    owner = get_user_model().objects.create(username=f"prop-{uuid.uuid4().hex}")
    return conversation_create(owner=owner, trigger=trigger, keep=keep, max_context_tokens=ceiling)


def _reached(trigger: dict[str, int], ceiling: int | None, count: int, tokens: int) -> bool:
    """The trigger (every unit it sets, inclusive) or the ceiling, computed here on its own."""
    over = all(
        {"messages": count, "tokens": tokens}[unit] >= value for unit, value in trigger.items()
    )
    return over or (ceiling is not None and tokens > ceiling)


class InterleavingSummarizer(OfflineSummarizer):
    """The offline summarizer, running ``during`` inside its first call: what another
    process could append while a summary is being written (no lock is held then)."""

    during: ClassVar[Callable[[], None] | None] = None

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        hook, type(self).during = type(self).during, None
        if hook is not None:
            hook()
        return super().summarize(prompt=prompt, history=history, model=model, budget=budget)


INTERLEAVING = f"{__name__}.InterleavingSummarizer"


@st.composite
def interleaved(draw: st.DrawFn, call_ids: list[str]) -> list[dict[str, Any]]:
    """What arrives during a summarizer call: results for calls of the active context
    (whose requests the compaction may be archiving) and new turns."""
    messages = []
    for _ in range(draw(st.integers(0, 3))):
        if call_ids and draw(st.booleans()):
            call_id = draw(st.sampled_from(call_ids))
            messages.append(tool_result(call_id, draw(texts)))
        else:
            role = draw(st.sampled_from(["user", "assistant"]))
            messages.append({"role": role, "content": draw(texts)})
    return messages


def _snapshot(conversation: Conversation) -> dict[str, Any]:
    """Everything a compaction could change, compaction attempts excepted."""
    return {
        "conversation": Conversation.objects.filter(pk=conversation.pk).values().get(),
        "transcript": [
            (row.seq, row.as_openai(), row.summary_id, row.replaced_at, row.token_count)
            for row in transcript_list(conversation=conversation)
        ],
        "context": context_get(conversation=conversation).messages,
        "summaries": list(
            Summary.objects.filter(conversation=conversation).order_by("version").values()
        ),
    }


def _active_tail(conversation: Conversation) -> list:
    return list(conversation.messages.active().filter(is_leading=False).order_by("seq"))


def _assert_unchanged(conversation: Conversation, before: dict[str, Any], why: str) -> None:
    after = _snapshot(conversation)
    for key, value in before.items():
        assert after[key] == value, f"{why} changed the {key}"


@dataclass
class Run:
    """One example of the property: the conversation, what was appended to it so far, and
    the draws that decide every step."""

    data: st.DataObject
    conversation: Conversation
    trigger: dict[str, int]
    ceiling: int | None
    appended: list[dict[str, Any]] = field(default_factory=list)
    # Calls a result appended during a summarizer call answered: their own result, coming
    # later in the example's messages, would be a second one, which is refused.
    answered_meanwhile: set[str] = field(default_factory=set)
    compactions: int = 0


@dataclass
class Step:
    """One compaction attempt of a run: its mode, what it saw before, what it answered and
    what was appended during its summarizer call."""

    mode: str
    result: CompactionResult
    batch: list[dict[str, Any]]
    during: list[dict[str, Any]]
    summaries_before: int
    context_before: ActiveContext
    next_seq: int


@pytest.mark.django_db
@pytest.mark.slow
@PROPERTY_SETTINGS
@given(
    messages=conversations(min_turns=3),
    policy=policies(),
    summary_budget=st.sampled_from([(1024, 24000), (60, PROMPT_TOKENS + 60 + 300)]),
    data=st.data(),
)
def test_every_step_keeps_the_invariants(messages, policy, summary_budget, data):
    trigger, keep, ceiling = policy
    max_tokens, input_budget = summary_budget
    config = _ctxsum(
        SUMMARIZER=INTERLEAVING, SUMMARY_MAX_TOKENS=max_tokens, SUMMARY_INPUT_BUDGET=input_budget
    )
    with override_settings(CTXSUM=config):
        run = Run(data, _new_conversation(trigger, keep, ceiling), trigger, ceiling)
        sent = 0
        while sent < len(messages):
            size = data.draw(st.integers(1, 4), label="batch size")
            batch = [
                message
                for message in messages[sent : sent + size]
                if message.get("tool_call_id") not in run.answered_meanwhile
            ]
            sent += size
            if batch:
                _append(run, batch)
                _maybe_replace_the_system_prompt(run)
                _check_step(run, _compact(run, batch))
        target(float(run.compactions), label="compactions")


def _append(run: Run, batch: list[dict[str, Any]]) -> None:
    message_append(conversation=run.conversation, messages=batch)
    run.appended.extend(batch)
    assert_context_invariants(run.conversation, original_messages=run.appended)


def _maybe_replace_the_system_prompt(run: Run) -> None:
    """Now and then a PATCH {"system": ...}: the old leading message stays in the
    transcript."""
    if run.data.draw(st.integers(0, 19), label="replace system prompt") != 0:
        return
    count = run.conversation.message_count
    system = run.data.draw(texts, label="new system prompt")
    run.conversation = conversation_update(conversation=run.conversation, system=system)
    if run.conversation.message_count > count:
        run.appended.append({"role": "system", "content": system})
    assert_context_invariants(run.conversation, original_messages=run.appended)


def _append_meanwhile(run: Run, during: list[dict[str, Any]]) -> Callable[[], None]:
    """The hook the summarizer runs inside its call: appends that land while the summary
    is being written, recorded in ``during``."""
    conversation = run.conversation

    def append_meanwhile() -> None:
        call_ids = [
            call["id"]
            for row in conversation.messages.active().filter(tool_calls__isnull=False)
            for call in row.tool_calls
        ]
        for message in run.data.draw(interleaved(call_ids), label="appended meanwhile"):
            try:
                message_append(conversation=conversation, messages=[message])
            except ValidationError:
                continue  # a result for an archived or answered request: refused
            during.append(message)
            if message["role"] == "tool":
                run.answered_meanwhile.add(message["tool_call_id"])

    return append_meanwhile


def _compact(run: Run, batch: list[dict[str, Any]]) -> Step:
    """A compaction in a drawn mode (auto, forced or a dry run), with appends during its
    summarizer call; the invariants hold after it and the lease is given back."""
    conversation = run.conversation
    during: list[dict[str, Any]] = []
    InterleavingSummarizer.during = _append_meanwhile(run, during)
    mode = run.data.draw(st.sampled_from(["auto"] * 6 + ["force"] * 2 + ["dry_run"]))
    summaries_before = Summary.objects.filter(conversation=conversation).count()
    snapshot = _snapshot(conversation) if mode == "dry_run" else None
    context_before = context_get(conversation=conversation)
    next_seq = conversation.next_seq
    result = conversation_compact(
        conversation=conversation, force=mode == "force", dry_run=mode == "dry_run"
    )
    InterleavingSummarizer.during = None
    run.appended.extend(during)
    event(f"{mode}: {result.reason}{' +meanwhile' if during else ''}")
    assert_context_invariants(conversation, original_messages=run.appended)
    conversation.refresh_from_db()
    assert conversation.lease_owner == "" and conversation.leased_at is None
    if snapshot is not None:
        assert not result.compacted and not during
        _assert_unchanged(conversation, snapshot, "a dry run")
    return Step(mode, result, batch, during, summaries_before, context_before, next_seq)


def _check_step(run: Run, step: Step) -> None:
    """What a compaction that was not a dry run answered, checked against the database."""
    if step.mode == "dry_run":
        return
    _check_late_results(step)
    if not step.result.compacted:
        _check_not_compacted(run, step)
        return
    run.compactions += 1
    new = _check_compacted(run, step)
    _check_the_context_after(run, step)
    if run.data.draw(st.integers(0, 3), label="revert it") == 0:
        _check_revert(run, step, new)


def _check_late_results(step: Step) -> None:
    """A result for a request being archived arrived during the call: the commit would
    orphan it, so nothing is written (unless the summary was no gain, which is found first
    and writes nothing either)."""
    archived_calls = {call["id"] for row in step.result.archived for call in row.tool_calls or ()}
    if any(m.get("tool_call_id") in archived_calls for m in step.during):
        assert not step.result.compacted
        assert step.result.reason in (Reason.CONFLICT, Reason.NO_GAIN)


def _check_not_compacted(run: Run, step: Step) -> None:
    allowed = {Reason.NOTHING_TO_SUMMARIZE, Reason.NO_GAIN, Reason.CONFLICT}
    if step.mode == "auto":
        allowed.add(Reason.BELOW_TRIGGER)
    assert step.result.reason in allowed
    assert Summary.objects.filter(conversation=run.conversation).count() == step.summaries_before


def _check_compacted(run: Run, step: Step) -> Summary:
    """A compaction: one new active summary, at least one message archived, smaller than
    what it replaced. Answers the new summary."""
    result, before = step.result, step.summaries_before
    summaries = Summary.objects.filter(conversation=run.conversation)
    assert result.reason == Reason.COMPACTED
    assert summaries.count() == before + 1
    new = summaries.get(version=before + 1)
    assert result.summary is not None and result.summary.pk == new.pk
    assert new.active
    assert result.archived
    assert all(row.summary_id is None for row in result.archived)  # snapshot rows
    assert {row.seq for row in result.archived} == set(new.messages.values_list("seq", flat=True))
    replaced = sum(row.token_count for row in result.archived)
    if new.previous is not None:
        replaced += new.previous.token_count
    assert new.token_count < replaced
    return new


def _check_the_context_after(run: Run, step: Step) -> None:
    """The newest message kept verbatim; below the trigger (and the ceiling) unless the
    answer says otherwise; the attempt recorded as what happened."""
    result = step.result
    newest = step.during[-1] if step.during else step.batch[-1]
    tail = _active_tail(run.conversation)
    assert tail and tail[-1].as_openai() == newest
    context = context_get(conversation=run.conversation)
    assert context.messages[-1] == newest
    over = _reached(run.trigger, run.ceiling, len(context.messages), context.token_count)
    assert result.over_trigger == over
    attempt = result.attempt
    assert attempt is not None
    assert attempt.outcome == CompactionAttempt.Outcome.COMPACTED
    assert attempt.messages_archived == len(result.archived)
    assert attempt.tokens_after == context.token_count
    assert (attempt.from_seq, attempt.to_seq) == (
        result.archived[0].seq,
        result.archived[-1].seq,
    )


def _check_revert(run: Run, step: Step, new: Summary) -> None:
    """Undone: the context before the compaction, plus what came meanwhile."""
    conversation = run.conversation
    reverted = conversation_revert(conversation=conversation, version=new.version)
    assert reverted.reverted and reverted.restored == step.result.archived
    event("reverted")
    after = context_get(conversation=conversation)
    meanwhile = conversation.messages.filter(seq__gte=step.next_seq).order_by("seq")
    # The facts block aside: a message appended meanwhile may carry a fact's value, which
    # the block then leaves out (docs/architecture.md, "Key facts").
    before = _without_facts_block(step.context_before)
    assert _without_facts_block(after) == (
        [*before[0], *step.during],
        [*before[1], *(row.token_count for row in meanwhile)],
    )
    assert_context_invariants(conversation, original_messages=run.appended)


def _without_facts_block(context: ActiveContext) -> tuple[list[Any], list[int]]:
    """The context's messages and their tokens, but the facts block's (a pinned part of
    the layout)."""
    kinds = [part.kind for part in context.layout.pinned]
    kept = [
        (message, tokens)
        for index, (message, tokens) in enumerate(
            zip(context.messages, context.tokens, strict=True)
        )
        if index >= len(kinds) or kinds[index] != FACTS_BLOCK
    ]
    return [message for message, _ in kept], [tokens for _, tokens in kept]


# --- a failing summarizer changes nothing -------------------------------------------------


class ChunkFailingSummarizer(OfflineSummarizer):
    """Offline summaries for the first calls, then a failure: a chunked summary that breaks
    half-way. Options: ``fail_on`` (1-based call number), ``crash`` (raise RuntimeError, a
    backend bug, instead of SummarizerError)."""

    calls: ClassVar[int] = 0

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        type(self).calls += 1
        if type(self).calls >= self.options.get("fail_on", 1):
            if self.options.get("crash"):
                raise RuntimeError("backend bug")
            raise SummarizerError("The summarizer failed half-way.")
        return super().summarize(prompt=prompt, history=history, model=model, budget=budget)


CHUNK_FAILING = f"{__name__}.ChunkFailingSummarizer"
FAILURES = (
    "closed_port",
    "error",
    "blank",
    "null",
    "malformed",
    "text",
    "no_choices",
    "timeout",
    "later_chunk",
    "crash",
)


@pytest.fixture(scope="module")
def failing_server():
    with pytest.MonkeyPatch.context() as patch, running_fake_openai(patch) as server:
        yield server


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _failing_config(failure: str, server: FakeOpenAI) -> dict[str, Any]:
    """CTXSUM for one failure; sets the server's mode."""
    small = {"SUMMARY_MAX_TOKENS": 60, "SUMMARY_INPUT_BUDGET": PROMPT_TOKENS + 60 + 280}
    if failure in ("later_chunk", "crash"):
        ChunkFailingSummarizer.calls = 0
        options = {"fail_on": 2} if failure == "later_chunk" else {"crash": True}
        return _ctxsum(SUMMARIZER=CHUNK_FAILING, SUMMARIZER_OPTIONS=options, **small)
    server.reset()
    base_url = server.base_url
    timeout = 5
    if failure == "closed_port":
        base_url = f"http://127.0.0.1:{_closed_port()}/v1"
    elif failure == "timeout":
        server.mode, server.delay, timeout = "slow", 1.0, 0.2
    else:
        server.mode = failure
    return _ctxsum(
        SUMMARIZER=OPENAI,
        SUMMARIZER_OPTIONS={"base_url": base_url, "api_key": "test"},
        SUMMARY_TIMEOUT=timeout,
    )


@pytest.mark.django_db
@pytest.mark.slow
@pytest.mark.parametrize("failure", FAILURES)
@hypothesis_settings(PROPERTY_SETTINGS, max_examples=examples(6))
@given(messages=conversations(min_turns=4), policy=policies(), split=st.floats(0, 1))
def test_a_failing_summarizer_changes_nothing(failing_server, failure, messages, policy, split):
    trigger, keep, _ = policy
    # Some history first, compacted by the offline summarizer so a summary may exist.
    head = max(1, int(len(messages) * split))
    with override_settings(CTXSUM=_ctxsum(SUMMARIZER=OFFLINE_SUMMARIZER)):
        conversation = _new_conversation(trigger, keep)
        message_append(conversation=conversation, messages=messages[:head])
        conversation_compact(conversation=conversation, force=True)
        if head < len(messages):
            message_append(conversation=conversation, messages=messages[head:])
        plan = conversation_compact(conversation=conversation, force=True, dry_run=True)
    assume(plan.reason == Reason.DRY_RUN)  # there is something to summarize
    # ... that the offline summary did not already find to be no gain (it is not resent).
    assume(not CompactionAttempt.objects.filter(conversation=conversation, reason="no_gain"))

    before = _snapshot(conversation)
    attempts = CompactionAttempt.objects.filter(conversation=conversation)
    attempts_before = attempts.count()
    with override_settings(CTXSUM=_failing_config(failure, failing_server)):
        raised: BaseException | None = None
        try:
            result = conversation_compact(conversation=conversation, force=True)
        except (SummarizerError, RuntimeError) as error:
            raised = error
    if failure == "later_chunk" and raised is None:
        # The history fitted in one call, so the failure never came: a normal compaction.
        event("later_chunk: one chunk only")
        assert result.compacted or result.reason == Reason.NO_GAIN
        assert_context_invariants(conversation, original_messages=messages)
        return

    expected = RuntimeError if failure == "crash" else SummarizerError
    assert type(raised) is expected, f"{failure}: raised {raised!r}"
    _assert_unchanged(conversation, before, f"a failed compaction ({failure})")
    assert_context_invariants(conversation, original_messages=messages)
    assert attempts.count() == attempts_before + 1
    attempt = attempts.order_by("-created_at", "-pk").first()
    assert attempt.outcome == CompactionAttempt.Outcome.FAILED
    assert attempt.summary_id is None
    assert attempt.error
    if failure not in ("closed_port", "later_chunk", "crash"):
        assert len(failing_server.requests) == 1  # one attempt, no retry


# --- found while writing these properties -------------------------------------------------


@pytest.mark.django_db
def test_a_late_result_for_an_archived_request_never_orphans_the_context():
    """A user message between a tool request and its result lets a compaction archive the
    request (the newest message, the user's, is what is kept). The late result must then be
    refused: the context keeps no tool result without its request."""
    messages = [
        user_message("Book the 07:10 flight to Delhi, window seat, 340 EUR."),
        assistant_calls("c1", name="book"),
        user_message("Hurry up, please."),
        user_message("Are you there?"),
        user_message("Hello?"),
    ]
    late = tool_result("c1", "Booked AI-101.")
    with override_settings(CTXSUM=_ctxsum(SUMMARIZER=OFFLINE_SUMMARIZER)):
        conversation = _new_conversation({"messages": 5}, {"messages": 1})
        message_append(conversation=conversation, messages=messages)
        result = conversation_compact(conversation=conversation)
        assert result.compacted and [row.seq for row in result.archived] == [0, 1, 2, 3]
        with pytest.raises(ValidationError) as refused:
            message_append(conversation=conversation, messages=[late])
        assert refused.value.message_dict == {
            "messages[0].tool_call_id": [TOOL_CALL_ID_ARCHIVED.format(id="c1")]
        }
        assert_context_invariants(conversation, original_messages=messages)
