"""docs/api.md: summaries and the transcript, and writing: appends, new conversations,
changes."""

from __future__ import annotations

import json
from collections.abc import Callable

from django.conf import settings
from django.test import override_settings

from ctxsum.services import WITHHELD
from project.api_docs import samples
from project.api_docs.document import SUMMARY_IN_SHORT, Document, expect

MESSAGES = "/conversations/$CONV/messages/"


def summaries_and_transcript(document: Document) -> None:
    document.text("## Summaries and the transcript")
    document.request("GET", "/conversations/$CONV/summaries/")
    document.text(
        "Archived messages stay in the transcript, marked with the summary that replaced them:"
    )
    document.request("GET", f"{MESSAGES}?page_size=3")


def writing(document: Document) -> None:
    document.text("## Writing")
    document.request("POST", MESSAGES, {"role": "user", "content": "Can I take a 23 kg bag?"})
    document.text("A batch is stored all or none; errors name the message and the field:")
    batch = [
        {"role": "user", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_x", "content": "1"},
    ]
    document.request("POST", MESSAGES, {"messages": batch})
    document.text("A result for a call that a summary has archived can no longer join the context:")
    late = {"role": "tool", "tool_call_id": "call_lookup_01", "content": "late"}
    document.request("POST", MESSAGES, late)
    document.text("A new conversation, with a system prompt, a policy and its first message:")
    body = {
        "title": "New chat",
        "system": "You are terse.",
        "policy": {"trigger": {"messages": 8}, "keep": {"messages": 4}},
        "messages": [{"role": "user", "content": "Hello"}],
    }
    created = document.call("POST", "/conversations/", body)
    document.name("NEW", created.data["id"])
    document.show(created, hide={"stats"})


def auto_compact(document: Document) -> None:
    policy = {"trigger": {"messages": 8}, "keep": {"messages": 4}}
    document.text(
        f"""
        `AUTO_COMPACT` is on by default (the other requests of this page ran with it off, to
        show each compaction on its own): an append that reaches the trigger enqueues a
        compaction task once it has committed and answers at once, and a task worker
        (`manage.py db_worker`, which `make run` starts) compacts the conversation moments
        later. With `CTXSUM = {{..., "COMPACTION_RUNNER": "sync"}}` the compaction runs in
        the request instead, once the append has committed, and the answer shows what it
        did; the next two requests ran so. First messages are an append too: a new
        conversation whose messages reach its trigger is compacted before the 201 answers,
        and the answer shows the compacted conversation (it has no `compaction` field; a
        failure there leaves it created, uncompacted). A system prompt and seven
        messages with `{json.dumps(policy)}`:
        """
    )
    body = {"title": "Porto week", "system": "You plan trips.", "policy": policy}
    sync = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "sync"}
    with override_settings(CTXSUM=sync):
        created = document.call("POST", "/conversations/", {**body, "messages": samples.PORTO})
        document.name("PORTO", created.data["id"])
        expect(created.data["summary"] is not None, "the first messages were compacted")
        document.show(created, only=SUMMARY_IN_SHORT, curl=False)
        document.text(
            """
            The answer to an append says what the compaction after it did; a failure there
            is reported in it (`"reason": "summarizer_error"` with a `detail`), and the
            append stands:
            """
        )
        more = {"messages": samples.PORTO_MORE}
        appended = document.request(
            "POST", "/conversations/$PORTO/messages/", more, items={"messages": 1}
        )
        expect(appended.data["compaction"]["compacted"], "the append was followed by one")
    document.text(
        """
        With the default runner (`"tasks"`), the same conversation and the same append: the
        answer says the compaction is `queued`, and the context stays whole and correct
        until the worker's compaction commits:
        """
    )
    with override_settings(CTXSUM={**settings.CTXSUM, "AUTO_COMPACT": True}):
        created = document.call("POST", "/conversations/", {**body, "messages": samples.PORTO})
        document.name("QUEUED", created.data["id"])
        queued = document.request(
            "POST", "/conversations/$QUEUED/messages/", more, items={"messages": 1}
        )
        expect(queued.data["compaction"]["reason"] == "queued", "the append queued a task")


def changes(document: Document) -> None:
    system = {"system": "You are the Northwind Travel assistant. Be brief."}
    before = document.call("GET", "/conversations/$CONV/").data
    changed = document.call("PATCH", "/conversations/$CONV/", system)
    first = document.call("GET", f"{MESSAGES}?page_size=1").data["results"][0]
    expect(first["replaced"] and first["seq"] == 0, "the old system prompt is marked replaced")
    expect(changed.data["revision"] > before["revision"], "revision moves")
    document.text("A new `system` prompt replaces the leading system message:")
    document.show(changed, only={"id", "revision", "system"})
    document.text(
        """
        The old system prompt stays in the transcript with `"replaced": true`; the new one
        leads the context, and `revision` moves. A policy change applies to the next
        compaction; it does not compact by itself, so the context may answer
        `"over_max_context_tokens": true` until then:
        """
    )
    ceiling = {"policy": {"max_context_tokens": 250}}
    document.request("PATCH", "/conversations/$CONV/", ceiling, only={"policy", "revision"})
    context = document.request("GET", "/conversations/$CONV/context/", hide={"messages", "summary"})
    expect(context.data["over_max_context_tokens"], "the new ceiling is not applied yet")
    document.text('`{"policy": null}` resets every override to the settings\' defaults:')
    document.request("PATCH", "/conversations/$CONV/", {"policy": None}, only={"policy"})


def erasure(document: Document) -> None:
    document.text("## Redaction and stale summaries")
    transcript = document.call("GET", f"{MESSAGES}?page_size=500").data["results"]
    seq = next(m["seq"] for m in transcript if m["archived"] and m["role"] == "tool")
    document.text(
        f"""
        Redacting a message erases its words and keeps its place: the content becomes
        `[redacted]` (a tool call keeps its id and name, not its arguments), tokens and
        counters are recounted. Message {seq}, an archived tool result:
        """
    )
    document.request("POST", f"{MESSAGES}{seq}/redact/")
    document.text(
        """
        Every summary version covering it is withheld in the same transaction: its text
        becomes a short notice, which the context shows from then on, and it is stale (so
        are summaries written under another prompt: `PROMPT_VERSION` or `PROMPT` changed
        since). With `AUTO_COMPACT`, the redaction enqueues a rebuild:
        """
    )
    summaries = "/conversations/$CONV/summaries/"
    listed = document.request("GET", f"{summaries}?page_size=1", hide={"prompt_sha256"})
    withheld = listed.data["results"][0]
    expect(withheld["stale"], "a summary covering a redacted message is stale")
    expect(withheld["text"] == WITHHELD, "a summary covering a redacted message is withheld")
    document.text(
        """
        A rebuild writes the active summary anew from the archived originals, as redacted,
        under the current prompt; the new version covers the same messages, and the one it
        replaces stays, marked superseded:
        """
    )
    rebuilt = document.request("POST", f"{summaries}rebuild/", hide={"context", "summary.text"})
    expect(rebuilt.data["rebuilt"] and not rebuilt.data["summary"]["stale"], "rebuilt")


def undo(document: Document) -> None:
    summaries = "/conversations/$PORTO/summaries/"
    listed = document.call("GET", summaries).data["results"]
    version = next(summary["version"] for summary in listed if summary["active"])
    document.text(
        f"""
        ## Undoing a compaction

        Reverting the active summary undoes the compaction that wrote it: the version it
        extended becomes active again (or none), the messages it archived are active
        again, verbatim, and the context is what it was before that compaction plus
        whatever was appended since. The reverted version stays in the history, marked
        `reverted`. The Porto conversation's active summary is v{version}:
        """
    )
    hidden = {"context.messages", "context.summary", "summary.text"}
    reverted = document.request("POST", f"{summaries}{version}/revert/", hide=hidden)
    expect(reverted.data["reverted"] and reverted.data["messages_restored"], "reverted")
    document.text(
        """
        Reverting again walks back one more version. Only the active version can be
        reverted; any other is refused, naming `version`:
        """
    )
    refused = document.request("POST", f"{summaries}{version}/revert/")
    expect(refused.status == 400, "a reverted version cannot be reverted again")


def retries(document: Document) -> None:
    document.text(
        """
        ## Retrying safely: Idempotency-Key

        An append or a compaction sent with an `Idempotency-Key` header runs once: a retry
        with the same key and the same body (the first answer was lost on the way, say) is
        answered with the first answer, marked with the header `Idempotent-Replayed: true`,
        and stores nothing new. Keys belong to the user and the conversation and are kept a
        day (`IDEMPOTENCY_KEY_SECONDS`).
        """
    )
    key = {"Idempotency-Key": "retry-0001"}
    body = {"role": "user", "content": "And a 7 kg cabin bag?"}
    before = document.call("GET", "/conversations/$CONV/").data["message_count"]
    first = document.call("POST", MESSAGES, body, headers=key)
    document.show(first)
    document.text("The same request again, with the same key:")
    retry = document.call("POST", MESSAGES, body, headers=key)
    document.show(retry)
    after = document.call("GET", "/conversations/$CONV/").data["message_count"]
    expect(first.status == retry.status == 201, "both answer 201")
    expect(retry.data == first.data, "the retry answers the first answer")
    expect(after == before + 1, "the retry stored nothing")
    document.text(
        """
        The same key with another body, or on another endpoint, is refused; so is a retry
        while the first request still runs (`idempotency_key_in_progress`, answered at once).
        An error answer is not kept: a retry after a 400 or a 502 runs again.
        """
    )
    other = {"role": "user", "content": "And a 10 kg cabin bag?"}
    document.request("POST", MESSAGES, other, headers=key)


SECTIONS: tuple[Callable[[Document], None], ...] = (
    summaries_and_transcript,
    writing,
    auto_compact,
    changes,
    erasure,
    undo,
    retries,
)
