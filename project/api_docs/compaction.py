"""docs/api.md: the sample conversation and its compaction, and compactions that keep fewer
than KEEP."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.test import override_settings

from ctxsum.conf import ctxsum_settings
from ctxsum.policy import MIN_SUMMARY_BUDGET
from project.api_docs import samples
from project.api_docs.document import SUMMARY_IN_SHORT, Document, expect
from project.api_docs.fake_openai import cut_off_summarizer

COMPACT = "/conversations/$CONV/compact/"


def conversation(document: Document) -> None:
    document.text("## The conversation")
    document.request("GET", "/conversations/$CONV/")


def compaction(document: Document) -> None:
    document.text("## Compaction\n\nBelow the trigger nothing happens:")
    document.request("POST", COMPACT, {}, hide={"context"})
    dry_run = document.call("POST", COMPACT, {"force": True, "dry_run": True})
    plan = dry_run.data["plan"]
    archive = plan["archive"]
    cutoff = _message(document, archive["to_seq"] + 1)
    expect(len(cutoff.get("tool_calls", ())) == 2, "the cutoff is on the parallel tool calls")
    document.text(
        f"""
        A forced dry run shows what would be archived. The system message (seq 0) is pinned;
        keeping {plan["keep_count"]} messages puts the cutoff on seq {archive["to_seq"] + 1},
        an assistant message with two parallel tool calls, so seq
        {archive["from_seq"]} to {archive["to_seq"]} would go:
        """
    )
    document.show(dry_run, hide={"context"})
    _budget(document, plan)
    document.text("Forced for real:")
    document.request(
        "POST",
        COMPACT,
        {"force": True},
        hide={"context.summary"},
        items={"context.messages": 5},
    )
    document.text(
        f"""
        (The offline summarizer is extractive: it copies the sentences and tool calls that
        carry facts, oldest dropped first when they do not fit the length budget. With
        `OPENAI_API_KEY` or `OPENAI_BASE_URL` set, a model writes the summary.)

        Forcing again right away: `KEEP` keeps the {plan["keep_count"]} messages after the
        summary, which is all of them, so there is nothing to archive.
        """
    )
    again = document.request("POST", COMPACT, {"force": True}, hide={"context"})
    expect(again.data["reason"] == "nothing_to_summarize", "nothing is left to archive")


def _budget(document: Document, plan: dict[str, Any]) -> None:
    """The dry run's estimate, worked out from its own numbers."""
    archive = plan["archive"]
    archived = _tokens(document, archive["from_seq"], archive["to_seq"])
    cap = ctxsum_settings.SUMMARY_MAX_TOKENS * 3 // 4
    goal = int(ctxsum_settings.TARGET_RATIO * ctxsum_settings.TRIGGER["tokens"])
    budget = max(MIN_SUMMARY_BUDGET, min(cap, archived // 2, goal // 2))
    before, after = plan["tokens_before"], plan["tokens_after"]
    framing = after - (before - archived + budget)
    expect(0 < framing < 30, "the summary message's framing is a few tokens")
    document.facts["framing"] = framing
    document.text(
        f"""
        `tokens_after` is an estimate: it counts the summary at its length budget, since the
        summary is not written yet. The budget is the previous summary's tokens plus half of
        the newly archived ones, at most 3/4 of `SUMMARY_MAX_TOKENS` ({cap}) and half of the
        token goal (`TARGET_RATIO` of the token trigger or of the ceiling, whichever is
        lower: {goal} here), and at least {MIN_SUMMARY_BUDGET}. There is no summary yet, so
        it is {budget}, half of the {archived} tokens of seq
        {archive["from_seq"]} to {archive["to_seq"]}: {before} - {archived} + {budget}, plus
        {framing} for the summary message's framing.
        """
    )


def more_messages(document: Document) -> None:
    document.text("Four more messages, a note to the hotel with its tool round:")
    document.request(
        "POST",
        "/conversations/$CONV/messages/",
        {"messages": samples.HOTEL_NOTE},
        items={"messages": 1},
    )


def failures(document: Document) -> None:
    before = document.call("GET", "/conversations/$CONV/").data
    with _summarizer(base_url=_closed_port()):
        unreachable = document.call("POST", COMPACT, {"force": True})
    with cut_off_summarizer() as base_url, _summarizer(base_url=base_url):
        cut_off = document.call("POST", COMPACT, {"force": True})
    after = document.call("GET", "/conversations/$CONV/").data
    expect(before["stats"] == after["stats"], "a failed compaction changes nothing")
    expect(before["revision"] == after["revision"], "a failed compaction changes nothing")
    document.text(
        """
        A compaction now has messages to archive, so it calls the summarizer. One that
        cannot be reached (here the OpenAI backend pointed at a closed port) answers 502,
        and the conversation's `revision` and stats stay as they were; the attempt is
        recorded as failed, with the provider's own words, which the client does not see:
        """
    )
    document.show(unreachable, curl=False)
    document.text(
        """
        An answer cut off at `SUMMARY_MAX_TOKENS` (`finish_reason: "length"`) is a failure
        too, never a stored summary:
        """
    )
    document.show(cut_off, curl=False)
    document.recorded["summarizer_error"] = unreachable


def second_summary(document: Document) -> None:
    document.text(
        """
        With the offline summarizer again, the compaction writes version 2 from version 1
        plus the newly archived messages; `covers` is cumulative:
        """
    )
    compacted = document.request(
        "POST", COMPACT, {"force": True}, hide={"context", "summary.text"}
    ).data
    plan, summaries = compacted["plan"], document.call("GET", "/conversations/$CONV/summaries/")
    previous = summaries.data["results"][1]["output_tokens"]
    archived = _tokens(document, plan["archive"]["from_seq"], plan["archive"]["to_seq"])
    budget = min(ctxsum_settings.SUMMARY_MAX_TOKENS * 3 // 4, previous + archived // 2)
    before, after, framing = plan["tokens_before"], plan["tokens_after"], document.facts["framing"]
    expect(after == before - previous - archived + budget, "the estimate's arithmetic")
    document.text(
        f"""
        Its budget is version 1's {previous} tokens plus half of the {archived} newly
        archived, {budget}, so the summary can grow as the conversation does. The estimate
        replaces version 1's message ({previous} + {framing} tokens) and the archived ones
        with a message of that budget: {before} - {previous + framing} - {archived} +
        {budget + framing} = {after}.
        """
    )


def fewer_than_keep(document: Document) -> None:
    keep, ceiling = 10, 400
    policy = {
        "trigger": {"messages": 30},
        "keep": {"messages": keep},
        "max_context_tokens": ceiling,
    }
    body = {"system": samples.REPAIR_SYSTEM, "policy": policy, "messages": samples.REPAIR}
    created = document.call("POST", "/conversations/", body)
    document.name("CEIL", created.data["id"])
    document.text(
        f"""
        ### Keeping fewer than KEEP

        A conversation (`$CEIL`) with `"policy": {json.dumps(policy)}`, a system prompt and
        {len(samples.REPAIR)} longer messages is below its message trigger but above its
        ceiling:
        """
    )
    document.request("GET", "/conversations/$CEIL/context/", hide={"messages"})
    goal = int(ctxsum_settings.TARGET_RATIO * ceiling)
    result = document.call("POST", "/conversations/$CEIL/compact/", {})
    kept = result.data["plan"]["keep_count"]
    expect(kept < keep, "fewer than KEEP stay")
    document.text(
        f"""
        Keeping {keep} messages would leave it over {ceiling} tokens. A compaction that keeps
        fewer than `KEEP` aims at `TARGET_RATIO` of the ceiling ({goal} tokens), not just
        under it, so that the next append does not compact again at once; the summary's
        budget is at most half of that, {goal // 2} tokens. With messages this long
        {"only the newest message stays" if kept == 1 else f"the newest {kept} stay"}:
        """
    )
    document.show(result, only=SUMMARY_IN_SHORT, hide={"context.messages", "context.summary"})


def over_trigger(document: Document) -> None:
    policy = {"trigger": {"tokens": 300}, "keep": {"tokens": 200}}
    created = document.call("POST", "/conversations/", {"policy": policy, "messages": samples.LOG})
    document.name("LOG", created.data["id"])
    document.text(
        f"""
        When even the newest message alone is over the trigger (here `$LOG`, with
        `"policy": {json.dumps(policy)}` and a pasted log of
        {_last_tokens(document, "LOG")} tokens as the newest message), the compaction
        archives everything before it and says so; compacting again finds nothing to
        archive, so there is no loop:
        """
    )
    hide = {"context.messages", "context.summary"}
    document.request("POST", "/conversations/$LOG/compact/", {}, only=SUMMARY_IN_SHORT, hide=hide)
    document.request("POST", "/conversations/$LOG/compact/", {}, hide={"context"})


def no_gain(document: Document) -> None:
    document.text(
        """
        A summary that is not smaller than what it would replace is not stored. A
        conversation (`$TINY`) of four one-word turns:
        """
    )
    policy = {"trigger": {"tokens": 20}, "keep": {"messages": 1}}
    body = {"policy": policy, "messages": samples.ONE_WORD_TURNS}
    created = document.call("POST", "/conversations/", body)
    document.name("TINY", created.data["id"])
    document.show(created, only={"id", "active_tokens"})
    document.request("POST", "/conversations/$TINY/compact/", {}, hide={"context"})
    document.text(
        """
        The attempt is recorded with its range, and the same range is not sent to the
        summarizer again until more messages have made it longer.
        """
    )


def _message(document: Document, seq: int) -> dict[str, Any]:
    page = document.call("GET", f"/conversations/$CONV/messages/?page_size=1&page={seq + 1}")
    message: dict[str, Any] = page.data["results"][0]
    expect(message["seq"] == seq, f"seq {seq} is on page {seq + 1}")
    return message


def _tokens(document: Document, first: int, last: int) -> int:
    """The tokens of messages ``first`` to ``last`` of $CONV, as the transcript says."""
    page = document.call("GET", "/conversations/$CONV/messages/?page_size=500").data
    return sum(m["token_count"] for m in page["results"] if first <= m["seq"] <= last)


def _last_tokens(document: Document, variable: str) -> int:
    page = document.call("GET", f"/conversations/${variable}/messages/").data
    tokens: int = page["results"][-1]["token_count"]
    return tokens


def _closed_port() -> str:
    """The address of a port nothing listens on: one the system just handed out."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@contextmanager
def _summarizer(*, base_url: str) -> Iterator[None]:
    """The OpenAI backend, at ``base_url``, for the requests made meanwhile."""
    options = {"base_url": base_url, "api_key": "unused"}
    backend = "ctxsum.summarizers.openai.OpenAISummarizer"
    ctxsum = {**settings.CTXSUM, "SUMMARIZER": backend, "SUMMARIZER_OPTIONS": options}
    with override_settings(CTXSUM=ctxsum):
        yield


SECTIONS: tuple[Callable[[Document], None], ...] = (
    conversation,
    compaction,
    more_messages,
    failures,
    second_summary,
    fewer_than_keep,
    over_trigger,
    no_gain,
)
