"""The LangChain comparison (bench/vs_langchain.py) on three conversations of the shipped
sample: what it reports must hold up against an independent recount. Skipped when
LangChain is not installed (it is in the ``bench`` extra, not in ``dev``)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("langchain.agents.middleware")

import tiktoken
from langchain_core.messages import convert_to_openai_messages

from bench.fixed_summary import FIXED_SUMMARY, SUMMARY_TOKENS
from bench.vs_ctxsum import run_ctxsum
from bench.vs_lc import run_langchain
from bench.vs_sides import full_history, message_counts
from tests.support.shared import FIXTURE_CONVERSATIONS, FIXTURES_DIR, REPO_ROOT

pytestmark = pytest.mark.django_db
# A coding agent run (system message, tool calls, a reused call id), an airline agent run,
# and a 52-message dialogue without a system message.
CHOSEN = ("sweagent-", "taubench-gpt-4o-airline", "star-4965")
ENCODING = tiktoken.get_encoding("o200k_base")


def encoded(text: str) -> int:
    return len(ENCODING.encode(text, disallowed_special=()))


def recount(messages: list[dict[str, Any]]) -> int:
    """OpenAI's chat accounting written out again, without ctxsum.tokens."""
    total = 3
    for message in messages:
        total += 3 + encoded(message["role"])
        content = message.get("content")
        if isinstance(content, str):
            total += encoded(content)
        elif content:
            total += sum(encoded(part.get("text", "")) for part in content)
        for call in message.get("tool_calls") or ():
            total += 3 + encoded(call["function"]["name"]) + encoded(call["function"]["arguments"])
        if message.get("tool_call_id"):
            total += encoded(message["tool_call_id"])
        if message.get("name"):
            total += 1 + encoded(message["name"])
    return total


def as_sent(state: list[Any], originals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LangChain's messages in OpenAI format, with each recorded tool call's arguments as
    recorded: LangChain's conversion re-serializes them (``{"a":1}`` becomes ``{"a": 1}``),
    and the comparison bills the recorded text on every side."""
    converted = convert_to_openai_messages(state)
    for message, sent in zip(state, converted, strict=True):
        if sent.get("tool_calls"):
            sent["tool_calls"] = originals[int(message.id[1:])]["tool_calls"]
    return converted


@pytest.fixture
def records() -> list[dict[str, Any]]:
    lines = FIXTURE_CONVERSATIONS.read_text(encoding="utf-8").splitlines()
    every = [json.loads(line) for line in lines if line.strip()]
    return [next(r for r in every if r["id"].startswith(prefix)) for prefix in CHOSEN]


@pytest.fixture(autouse=True)
def fixed_summarizer(settings: Any) -> None:
    settings.CTXSUM = {
        **(getattr(settings, "CTXSUM", None) or {}),
        "SUMMARIZER": "bench.fixed_summary.FixedSummarizer",
        "ENCODING": "o200k_base",
        "AUTO_COMPACT": False,
    }


def test_the_fixed_summary_is_120_tokens() -> None:
    assert encoded(FIXED_SUMMARY) == SUMMARY_TOKENS == 120


@pytest.mark.parametrize("mode", ["system_prompt", "in_state"])
def test_langchain_tokens_sent_equal_an_independent_recount(records: Any, mode: str) -> None:
    for record in records:
        messages = record["messages"]
        pinned = mode == "system_prompt" and messages[0]["role"] == "system"
        prompt = [messages[0]] if pinned else []
        seen: list[tuple[int, int]] = []

        def observe(
            call: Any,
            state: list[Any],
            prompt: Any = prompt,
            seen: Any = seen,
            originals: Any = messages,
        ) -> None:
            seen.append((call.sent, recount(prompt + as_sent(state, originals))))

        result = run_langchain(messages, message_counts(messages), mode=mode, observe=observe)
        assert result.summaries > 0, record["id"]
        assert len(seen) == len(result.calls) == sum(m["role"] == "assistant" for m in messages)
        assert [sent for sent, _ in seen] == [again for _, again in seen], record["id"]


def test_ctxsum_keeps_the_system_prompt_and_langchain_in_state_loses_it(
    records: Any, user: Any
) -> None:
    for record in records[:2]:
        messages = record["messages"]
        counts = message_counts(messages)
        ctxsum = run_ctxsum(record, counts, owner=user, check=True)
        assert ctxsum.summaries > 0
        assert ctxsum.system_kept is True
        assert {call.system for call in ctxsum.calls} == {counts[0]}
        assert run_langchain(messages, counts, mode="system_prompt").system_kept is True
        in_state = run_langchain(messages, counts, mode="in_state")
        assert in_state.system_kept is False
        assert in_state.calls[-1].system == 0


def test_billing_adds_the_summarizer_and_ctxsum_never_sends_more_than_the_history(
    records: Any, user: Any
) -> None:
    for record in records:
        messages = record["messages"]
        counts = message_counts(messages)
        ctxsum = run_ctxsum(record, counts, owner=user, check=True)
        full = full_history(messages, counts)
        assert ctxsum.summarizer_calls >= ctxsum.summaries > 0
        assert ctxsum.summarizer_out == SUMMARY_TOKENS * ctxsum.summarizer_calls
        assert ctxsum.billed == ctxsum.sent + ctxsum.summarizer_in + ctxsum.summarizer_out
        assert all(c.sent <= f.sent for c, f in zip(ctxsum.calls, full.calls, strict=True))
        assert ctxsum.calls[-1].sent < full.calls[-1].sent


def test_the_command_reports_every_side(tmp_path: Any) -> None:
    output = tmp_path / "vs.json"
    command = [sys.executable, "-m", "bench.vs_langchain", "--data-dir", str(FIXTURES_DIR),
               "--files", FIXTURE_CONVERSATIONS.name, "--limit", "3", "--jobs", "1",
               "--no-plots", "--check", "--output", str(output)]  # fmt: skip
    subprocess.run(command, cwd=REPO_ROOT, check=True, capture_output=True, timeout=300)
    report = json.loads(output.read_text())
    assert report["conversations"] == 3
    ctxsum, in_state = report["sides"]["ctxsum"], report["sides"]["langchain_in_state"]
    assert ctxsum["system_kept_in_every_call"] == ctxsum["conversations_with_system"] == 3
    assert in_state["system_kept_in_every_call"] < 3
    assert report["sides"]["full"]["billed_vs"]["full"] == 1.0
    assert len(report["per_conversation"]) == 3


@pytest.mark.ctxsum_defaults
def test_ctxsum_as_shipped_bills_the_key_facts_of_each_summarizer_answer(
    records: Any, user: Any, settings: Any
) -> None:
    """With the facts summarizer (the command's default), each call's answer is the fixed
    summary and a <facts> block, billed as output: more than the summary alone."""
    from bench.fixed_summary import FixedSummarizer, ctxsum_call_tokens

    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": "bench.fixed_summary.FixedFactsSummarizer"}
    record = records[1]  # the airline run: booking codes, amounts, dates
    counts = message_counts(record["messages"])
    ctxsum = run_ctxsum(record, counts, owner=user, check=True)

    assert ctxsum.summaries > 0 and ctxsum.summarizer_calls == len(FixedSummarizer.calls)
    answers = [call.answer for call in FixedSummarizer.calls]
    assert all(answer.startswith(FIXED_SUMMARY + "\n<facts>[") for answer in answers)
    assert ctxsum.summarizer_out > SUMMARY_TOKENS * ctxsum.summarizer_calls
    assert ctxsum.summarizer_out == sum(
        ctxsum_call_tokens(call)[1] for call in FixedSummarizer.calls
    )
