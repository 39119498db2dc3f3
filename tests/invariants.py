"""The invariants every conversation must satisfy after any append or compaction, checked
against the database.

``assert_context_invariants(conversation, original_messages=None)`` re-reads the
conversation, its rows and its summaries, and asserts (with messages that say what broke):

(a) the active context (``context_get``) starts with the leading system/developer message
    when the conversation has one;
(b) it holds at most one summary message: the active summary, as a user message starting
    with ``SUMMARY_PREFIX``, right after the leading message (or first); then at most one
    key facts block: the facts ``facts_chosen`` picks of those the conversation shows
    within its ``facts_budget``, as the user message ``block_message`` makes of them, right
    after the summary (or the leading message, or first), with ``block_tokens`` of them,
    equal to ``facts_tokens``; every fact it leaves out (``hidden``) has its value in the
    summary's text or a kept message (``carries``);
(c) it ends with the newest original messages verbatim: every active non-leading row, in seq
    order (``as_openai()``), is the context's tail, and no archived row is newer than an
    active one. With ``original_messages`` (every message appended, in append order, in the
    normalized form ``clean_message`` returns: ``content`` present, absent fields omitted),
    the transcript equals it message for message and the tail equals
    ``original_messages[-k:]`` for the k active non-leading messages (taken by seq when a
    system message was replaced later, so the new leading message is not in the tail);
(d) no tool result in the context lacks its request: an earlier assistant message of the
    context with a tool call of that id;
(e) nothing is lost and the bookkeeping adds up: rows are seq 0..n-1 with
    n == message_count == next_seq; every row is active, archived under exactly one
    summary, or a replaced leading message; archived rows form contiguous, version-ordered
    runs before the active ones; summaries are versions 1..k; the ones not reverted form
    one chain, each ``previous`` the one before it, each covering (cumulatively) exactly
    from the first archived seq to the last seq archived under it or its predecessors; a
    reverted summary is inactive, archives nothing and names an older ``previous``; a
    summary is superseded iff a rebuild that is not reverted replaced it; there is an
    active summary iff a row is archived, and it is the newest one not reverted, never
    superseded; every summary names its prompt version, prompt SHA-256 (64 hex) and model,
    with from_seq <= to_seq; the counters (active_message_count, active_tokens with the
    active summary and the facts block, facts_tokens, message_count, next_seq) equal the
    sums over the rows, and so do those the stats read (archived_message_count,
    archived_tokens, summary_count, compaction_count: the compacted attempts).
(f) erasure: a summary version whose range holds a message redacted after the version was
    written is withheld (``covers_redacted``, its text a withheld notice, no coverage
    check); with ``original_messages``, a redacted message's transcript row is its redacted
    form, and its original text (when it is distinctive: 16 characters or more and part of
    no other message) is nowhere in the context, any summary, or the facts and their
    history that the conversation wrote or shows.

A plain function so any test can call it after any step; it reads, never writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from ctxsum.conf import ctxsum_settings
from ctxsum.coverage import message_texts
from ctxsum.facts.block import (
    block_message,
    block_order,
    block_tokens,
    facts_budget,
    facts_chosen,
    facts_visible,
)
from ctxsum.facts.lines import carries, normalized
from ctxsum.facts.models import Fact, FactChange
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import LEADING_ROLES
from ctxsum.selectors import ActiveContext, context_get, summary_message, transcript_list
from ctxsum.services.redaction import WITHHELD, WITHHELD_SHORTER, redacted

_SHA256 = re.compile(r"[0-9a-f]{64}")
WITHHELD_TEXTS = (WITHHELD, *WITHHELD_SHORTER)


@dataclass
class _State:
    """One conversation as the database holds it, split the way the invariants talk."""

    label: str
    conversation: Conversation
    rows: list[Message]  # the transcript, by seq
    summaries: list[Summary]  # by version
    context: ActiveContext
    leading: Message | None  # the current leading system/developer message
    active: list[Message]  # active non-leading rows, by seq
    archived: list[Message]  # archived rows, by seq
    facts: list[Fact]  # what the facts block should show, in its order
    active_summary: Summary | None = None

    @property
    def facts_tokens(self) -> int:
        return block_tokens(self.facts, model=self.conversation.model or None)

    @property
    def chain(self) -> list[Summary]:
        """The summaries not reverted, by version: the history the active one stands on."""
        return [summary for summary in self.summaries if not summary.reverted]


def assert_context_invariants(
    conversation: Conversation, *, original_messages: Sequence[Mapping[str, Any]] | None = None
) -> None:
    """Assert (a)-(e) above for ``conversation`` as the database holds it now."""
    state = _load(conversation)
    _check_rows(state)
    _check_summaries(state)
    _check_archived_ranges(state)
    _check_context_shape(state)
    originals = None if original_messages is None else [dict(m) for m in original_messages]
    if originals is not None:
        _check_originals(state, originals)
    _check_tool_results(state)
    _check_counters(state)
    _check_history_counters(state)
    _check_erasure(state, originals)


def _load(conversation: Conversation) -> _State:
    conversation = Conversation.objects.get(pk=conversation.pk)
    rows = list(transcript_list(conversation=conversation))
    current = [row for row in rows if row.replaced_at is None]
    leading_rows = [row for row in current if row.is_leading]
    label = f"conversation {conversation.pk}"
    assert len(leading_rows) <= 1, f"{label}: {len(leading_rows)} current leading messages"
    body = [row for row in rows if not row.is_leading]
    model = conversation.model or None
    return _State(
        label=label,
        conversation=conversation,
        rows=rows,
        # Without the coverage checks, which no invariant reads.
        summaries=list(
            Summary.objects.filter(conversation=conversation)
            .defer("coverage_facts")
            .order_by("version")
        ),
        context=context_get(conversation=conversation),
        leading=leading_rows[0] if leading_rows else None,
        active=[row for row in body if row.summary_id is None],
        archived=[row for row in body if row.summary_id is not None],
        # Every fact it shows, in block order.
        facts=facts_chosen(
            sorted(facts_visible(conversation), key=block_order),
            model=model,
            budget=facts_budget(conversation),
        ),
    )


def _check_rows(state: _State) -> None:
    """(e) Every row accounted for: seqs 0..n-1, n == message_count == next_seq; a row is
    active, archived, or a replaced leading message; the leading one is never archived."""
    label, conversation, rows = state.label, state.conversation, state.rows
    seqs = [row.seq for row in rows]
    assert seqs == list(range(len(rows))), f"{label}: seqs are not 0..n-1: {seqs}"
    assert conversation.message_count == len(rows), (
        f"{label}: message_count {conversation.message_count} but {len(rows)} rows"
    )
    assert conversation.next_seq == len(rows), (
        f"{label}: next_seq {conversation.next_seq} but {len(rows)} rows"
    )
    for row in rows:
        if row.replaced_at is not None:
            assert row.is_leading and row.summary_id is None, (
                f"{label}: seq {row.seq} is replaced but not a leading, unarchived message"
            )
    if rows and rows[0].role in LEADING_ROLES:
        assert rows[0].is_leading, f"{label}: seq 0 is a {rows[0].role} message, not leading"
    leading = state.leading
    if leading is not None:
        assert leading.summary_id is None, f"{label}: the leading message was archived"
        assert leading.role in LEADING_ROLES, (
            f"{label}: leading message seq {leading.seq} has role {leading.role!r}"
        )


def _check_summaries(state: _State) -> None:
    """(e) Versions 1..k; those not reverted form one chain, each extending the one before;
    a reverted one extends an older version; superseded iff a live rebuild replaced it;
    complete metadata; one active summary iff a row is archived, and it is the newest of
    the chain."""
    label, summaries = state.label, state.summaries
    versions = [summary.version for summary in summaries]
    assert versions == list(range(1, len(summaries) + 1)), (
        f"{label}: summary versions are {versions}, not 1..{len(summaries)}"
    )
    by_id = {summary.pk: summary for summary in summaries}
    chain = state.chain
    for index, summary in enumerate(chain):
        expected_previous = chain[index - 1] if index else None
        assert summary.previous_id == (expected_previous and expected_previous.pk), (
            f"{label}: summary v{summary.version} extends {summary.previous_id}, not "
            f"{f'v{expected_previous.version}' if expected_previous else 'nothing'}"
        )
    replaced_by_live_rebuild = {
        summary.previous_id
        for summary in chain
        if summary.origin == Summary.Origin.REBUILD and summary.previous_id is not None
    }
    for summary in summaries:
        name = f"{label}: summary v{summary.version}"
        if summary.reverted:
            assert not summary.active, f"{name} is reverted but active"
            previous = by_id.get(summary.previous_id) if summary.previous_id else None
            assert summary.previous_id is None or (
                previous is not None and previous.version < summary.version
            ), f"{name} extends {summary.previous_id}, not an older version of this conversation"
        assert summary.superseded == (summary.pk in replaced_by_live_rebuild), (
            f"{name}: superseded is {summary.superseded}, but "
            f"{'a' if summary.pk in replaced_by_live_rebuild else 'no'} rebuild in force "
            "replaced it"
        )
        assert summary.prompt_version, f"{name} has no prompt_version"
        assert _SHA256.fullmatch(summary.prompt_sha256 or ""), (
            f"{name}: prompt_sha256 {summary.prompt_sha256!r} is not 64 hex digits"
        )
        assert summary.model, f"{name} has no model"
        assert summary.from_seq <= summary.to_seq, (
            f"{name} covers {summary.from_seq}..{summary.to_seq}"
        )
        assert summary.text and summary.text.strip(), f"{name} is blank"
    active = [summary for summary in summaries if summary.active]
    assert len(active) == (1 if state.archived else 0), (
        f"{label}: {len(active)} active summaries with {len(state.archived)} archived rows"
    )
    if active:
        assert active[0] is chain[-1], (
            f"{label}: the active summary is v{active[0].version}, "
            f"not the newest one not reverted, v{chain[-1].version}"
        )
        state.active_summary = active[0]
    else:
        assert not chain, f"{label}: no active summary, but v{chain[-1].version} is not reverted"
    found = state.context.summary
    assert (found and found.pk) == (active[0].pk if active else None), (
        f"{label}: context_get found summary {found and found.pk}, not the active one"
    )


def _check_archived_ranges(state: _State) -> None:
    """(e) Archived rows form version-ordered contiguous runs, all older than every active
    row; each summary of the chain covers (cumulatively) exactly the span of its and its
    predecessors' rows, and archived at least one, unless a rebuild wrote it over its
    predecessor's range (which it then marks superseded); a reverted summary archives
    none: reverting gave its rows back to the context."""
    label = state.label
    by_id = {summary.pk: summary for summary in state.summaries}
    for row in state.archived:
        assert row.summary_id in by_id, (
            f"{label}: seq {row.seq} is archived under a summary of another conversation"
        )
    body = sorted([*state.archived, *state.active], key=lambda row: row.seq)
    labels = [(row.seq, by_id[row.summary_id].version if row.summary_id else None) for row in body]
    versions = [version for _, version in labels if version is not None]
    assert [version for _, version in labels] == [*versions, *[None] * len(state.active)], (
        f"{label}: an archived message is newer than an active one (seq, version): {labels}"
    )
    assert versions == sorted(versions), (
        f"{label}: archived runs are not in version order (seq, version): {labels}"
    )
    for summary in state.summaries:
        if summary.reverted:
            own = [row.seq for row in state.archived if row.summary_id == summary.pk]
            assert not own, f"{label}: reverted summary v{summary.version} archives {own}"
    covered: list[int] = []
    for summary in state.chain:
        own = [row.seq for row in state.archived if row.summary_id == summary.pk]
        if summary.origin == Summary.Origin.REBUILD:
            # Written anew over its predecessor's range: it archives nothing itself.
            assert not own, f"{label}: rebuilt summary v{summary.version} archived messages"
            assert summary.previous is not None and summary.previous.superseded, (
                f"{label}: rebuilt summary v{summary.version} does not supersede its predecessor"
            )
        else:
            assert own, f"{label}: summary v{summary.version} archived no message"
        covered.extend(own)
        assert (summary.from_seq, summary.to_seq) == (min(covered), max(covered)), (
            f"{label}: summary v{summary.version} says it covers "
            f"{summary.from_seq}..{summary.to_seq}; it and its predecessors archived "
            f"{min(covered)}..{max(covered)}"
        )


def _tail_start(state: _State) -> int:
    return (
        int(state.leading is not None)
        + int(state.active_summary is not None)
        + int(bool(state.facts))
    )


def _check_context_shape(state: _State) -> None:
    """(a) leading message first, (b) then the one summary message, then the one facts
    block, (c) then every active non-leading row verbatim, in seq order: nothing else."""
    label, messages = state.label, state.context.messages
    expected = [
        *([state.leading.as_openai()] if state.leading else []),
        *([summary_message(state.active_summary.text)] if state.active_summary else []),
        *([block_message(state.facts)] if state.facts else []),
        *[row.as_openai() for row in state.active],
    ]
    assert len(messages) == len(expected), (
        f"{label}: the context has {len(messages)} messages, expected {len(expected)} "
        f"(leading {int(state.leading is not None)}, "
        f"summary {int(state.active_summary is not None)}, facts {int(bool(state.facts))}, "
        f"active {len(state.active)})"
    )
    position = int(state.leading is not None) + int(state.active_summary is not None)
    if state.facts:
        assert messages[position] == expected[position], (
            f"{label}: context[{position}] is {messages[position]!r}, not the facts block "
            f"{expected[position]!r}"
        )
        assert state.context.tokens[position] == state.facts_tokens, (
            f"{label}: the facts block counts {state.context.tokens[position]} tokens in the "
            f"context, {state.facts_tokens} as a message"
        )
    summary = state.active_summary.text if state.active_summary else ""
    kept = message_texts(row.as_openai() for row in state.active)
    text = normalized("\n".join([summary, *kept]))
    for fact in facts_visible(state.conversation):
        assert not fact.hidden or carries(text, fact.value), (
            f"{label}: the facts block leaves out {fact.key}: {fact.value!r}, which neither "
            "the summary nor a kept message holds"
        )
    shown = state.context.shown("facts")
    assert [fact.pk for fact in shown] == [fact.pk for fact in state.facts], (
        f"{label}: context_get shows facts {[fact.key for fact in shown]}, "
        f"the block's choice is {[fact.key for fact in state.facts]}"
    )
    if state.leading is not None:
        assert messages[0] == expected[0], (
            f"{label}: the context starts with {messages[0]!r}, not the leading message "
            f"{expected[0]!r}"
        )
    if state.active_summary is not None:
        position = int(state.leading is not None)
        summary = messages[position]
        content = summary.get("content")
        assert summary.get("role") == "user" and isinstance(content, str), (
            f"{label}: context[{position}] should be the summary as a user message: {summary!r}"
        )
        assert content.startswith(ctxsum_settings.SUMMARY_PREFIX), (
            f"{label}: the summary message does not start with the prefix: {content[:80]!r}"
        )
        assert summary == expected[position], (
            f"{label}: context[{position}] is {summary!r}, not the active summary"
        )
    # Nothing else can be a summary: everything after it is an active row, checked here.
    start = _tail_start(state)
    for index, (got, want) in enumerate(zip(messages, expected, strict=True)):
        if index >= start:
            assert got == want, (
                f"{label}: context[{index}] is {got!r}, the active row there is {want!r}"
            )


def _check_originals(state: _State, originals: list[dict[str, Any]]) -> None:
    """(c) With the appended messages: the transcript is them, and the context's tail is the
    newest of them (by seq when a system message was replaced after seq 0)."""
    label = state.label
    assert len(state.rows) == len(originals), (
        f"{label}: {len(state.rows)} messages stored, {len(originals)} appended"
    )
    originals = [_as_stored(row, sent) for row, sent in zip(state.rows, originals, strict=True)]
    for row, sent in zip(state.rows, originals, strict=True):
        stored = row.as_openai()
        assert stored == sent, f"{label}: seq {row.seq} stored as {stored!r}, sent {sent!r}"
    tail = state.context.messages[_tail_start(state) :]
    count = len(state.active)
    if state.leading is None or state.leading.seq == 0:
        newest = originals[len(originals) - count :] if count else []
    else:
        newest = [originals[row.seq] for row in state.active]
    assert tail == newest, f"{label}: the context's tail is not the newest {count} messages"


def _check_tool_results(state: _State) -> None:
    """(d) Every tool result in the context follows a request for it in the context."""
    requested: set[str] = set()
    for index, message in enumerate(state.context.messages):
        if message.get("role") == "assistant":
            requested.update(call["id"] for call in message.get("tool_calls") or ())
        elif message.get("role") == "tool":
            assert message.get("tool_call_id") in requested, (
                f"{state.label}: context[{index}] is a result for "
                f"{message.get('tool_call_id')!r} with no earlier request in the context"
            )


def _check_counters(state: _State) -> None:
    """(e) active_message_count and active_tokens (the active summary's included) are the
    sums over the rows; context_get counts the same."""
    label, conversation = state.label, state.conversation
    in_context = [*([state.leading] if state.leading else []), *state.active]
    assert conversation.active_message_count == len(in_context), (
        f"{label}: active_message_count {conversation.active_message_count}, "
        f"but {len(in_context)} messages are active"
    )
    summary_tokens = state.active_summary.token_count if state.active_summary else 0
    assert conversation.facts_tokens == state.facts_tokens, (
        f"{label}: facts_tokens {conversation.facts_tokens}, the facts block it shows counts "
        f"{state.facts_tokens}"
    )
    expected_tokens = (
        sum(row.token_count for row in in_context) + summary_tokens + state.facts_tokens
    )
    assert conversation.active_tokens == expected_tokens, (
        f"{label}: active_tokens {conversation.active_tokens}, the rows, the active "
        f"summary and the facts block add up to {expected_tokens}"
    )
    assert sum(state.context.tokens) == expected_tokens, (
        f"{label}: context_get counts {sum(state.context.tokens)} tokens, the rows "
        f"{expected_tokens}"
    )
    by_query = Message.objects.filter(conversation=conversation).active().count()
    assert by_query == len(in_context), (
        f"{label}: {by_query} rows are active by query, {len(in_context)} by inspection"
    )


def _check_history_counters(state: _State) -> None:
    """(e) The counters the stats read equal a recount of the rows: the archived messages
    and their tokens, the summaries, the compactions and rebuilds committed."""
    compacted = CompactionAttempt.objects.filter(
        conversation=state.conversation, outcome=CompactionAttempt.Outcome.COMPACTED
    )
    recount = {
        "archived_message_count": len(state.archived),
        "archived_tokens": sum(row.token_count for row in state.archived),
        "summary_count": len(state.summaries),
        "compaction_count": compacted.count(),
    }
    stored = {name: getattr(state.conversation, name) for name in recount}
    assert stored == recount, f"{state.label}: the counters {stored}, a recount {recount}"


def _as_stored(row: Message, sent: dict[str, Any]) -> dict[str, Any]:
    """What ``sent`` is stored as: itself, or its redacted form once ``row`` was redacted."""
    if row.redacted_at is None:
        return sent
    erased = redacted(Message(content=sent.get("content"), tool_calls=sent.get("tool_calls")))
    # The provider extras are dropped; the content and the calls' arguments erased.
    form = {key: sent[key] for key in _OPENAI_KEYS if key in sent}
    form["content"] = erased["content"]
    if erased["tool_calls"]:
        form["tool_calls"] = erased["tool_calls"]
    return form


_OPENAI_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


def _check_erasure(state: _State, originals: list[dict[str, Any]] | None) -> None:
    """(f) Every version written before a redaction it covers is withheld; with the
    originals, a distinctive redacted text is nowhere current or derived."""
    label = state.label
    for row in state.rows:
        if row.redacted_at is None:
            continue
        for summary in state.summaries:
            if summary.from_seq <= row.seq <= summary.to_seq and (
                summary.created_at < row.redacted_at
            ):
                name = f"{label}: v{summary.version}, written before seq {row.seq}'s redaction,"
                assert summary.covers_redacted, f"{name} is not marked covers_redacted"
                assert summary.text in WITHHELD_TEXTS, f"{name} still has its text"
    if originals is None:
        return
    secrets = _redacted_texts(state, originals)
    if not secrets:
        return
    derived = [json.dumps(state.context.messages, ensure_ascii=False)]
    derived += [summary.text for summary in state.summaries]
    derived += _fact_texts(state.conversation)
    for seq, secret in secrets:
        for text in derived:
            assert secret not in text, (
                f"{label}: seq {seq}'s redacted text survives: {text[:200]!r}"
            )


def _redacted_texts(state: _State, originals: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """The redacted messages' original texts that no other message holds."""
    texts = [
        sent.get("content") if isinstance(sent.get("content"), str) else "" for sent in originals
    ]
    erased = {row.seq for row in state.rows if row.redacted_at is not None}
    kept = [text for seq, text in enumerate(texts) if seq not in erased]
    return [
        (seq, texts[seq])
        for seq in sorted(erased)
        if len(texts[seq]) >= 16 and not any(texts[seq] in other for other in kept)
    ]


def _fact_texts(conversation: Conversation) -> list[str]:
    shown = facts_visible(conversation).values("pk")
    facts = Fact.objects.filter(
        Q(conversation=conversation) | Q(source_conversation=conversation) | Q(pk__in=shown)
    )
    texts = [text for pair in facts.values_list("value", "proposed_value") for text in pair]
    changes = FactChange.objects.filter(fact__in=facts)
    texts += [
        text for pair in changes.values_list("old_value", "old_proposed_value") for text in pair
    ]
    return [text for text in texts if text]
