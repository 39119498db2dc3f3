"""What a compact call must have left behind, checked after every step of a replay: a
committed summary's metadata, size and range, the archived messages linked to it and its
attempt record; for a ``no_gain`` skip, that nothing was written and that a range is not
sent twice. Each check returns the problems it found (empty when none). Importing it needs
Django configured."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxsum import tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.models import CompactionAttempt, Message, Summary
from ctxsum.policy import Reason

# Bound here at import, not looked up on the compaction module at call time: a test that
# swaps the engine's helper for a broken one must still be caught by these checks.
from ctxsum.selectors import prompt_sha256, summary_message
from ctxsum.services.summaries import summary_model
from ctxsum.summarizers import get_summarizer
from ctxsum.summarizers.offline import OFFLINE_MODEL, OfflineSummarizer
from tests.support.summarizer_calls import SummarizerCall, call_problems


def replaced_tokens(result: Any, version_before: Any) -> int:
    """Tokens the compaction would replace: the archived messages and the summary that was
    active before it (``version_before``, None when there was none)."""
    archived = sum(row.token_count for row in result.archived or ())
    return archived + (version_before.token_count if version_before is not None else 0)


def summary_size(text: str, conversation: Any) -> int:
    """Tokens of ``text`` as the summary message of the context."""
    return tokens.count_message(summary_message(text), model=conversation.model or None)


def summary_problems(
    result: Any,
    *,
    version: int,
    leading: bool,
    calls: Sequence[SummarizerCall] | None = None,
    previous_summary: Any = None,
) -> list[str]:
    """What is wrong with the summary a compaction left (empty when nothing is).

    Version ``version``, the prompt version and the SHA-256 of PROMPT (the setting, not the
    prompt sent with its length budget), the model sent to the summarizer, a range that
    ends at the newest archived message and starts where the first summary started,
    ``previous`` pointing at version N-1 (now inactive), exactly the archived messages
    linked to it, a size below what it replaced, and, with ``calls`` (what the summarizer
    was sent), the prompt, model and budget of every call and the text of the last.
    """
    if result.summary is None:
        return ["compacted without a summary"]
    summary = Summary.objects.select_related("previous").get(pk=result.summary.pk)
    archived = [row.seq for row in result.archived or ()]
    problems = _metadata_problems(summary, result, version=version)
    if calls is not None:
        problems += _sent_problems(summary, result, calls)
    problems += _content_problems(summary, result, previous_summary)
    if not archived:
        return [*problems, "compacted but archived nothing"]
    problems += _range_problems(summary, archived, version=version, leading=leading)
    return problems + _record_problems(summary, archived, result.attempt)


def _metadata_problems(summary: Summary, result: Any, *, version: int) -> list[str]:
    """The version, the prompt setting it was written under, and the model."""
    problems = []
    if summary.version != version:
        problems.append(f"summary version {summary.version}, expected {version}")
    if not summary.prompt_version or summary.prompt_version != ctxsum_settings.PROMPT_VERSION:
        problems.append(f"prompt_version {summary.prompt_version!r}")
    if summary.prompt_sha256 != prompt_sha256(ctxsum_settings.PROMPT):
        problems.append(f"prompt_sha256 {summary.prompt_sha256!r} is not the prompt's hash")
    model = summary_model(result.context.conversation)
    if isinstance(get_summarizer(), OfflineSummarizer):
        model = OFFLINE_MODEL  # no model ran: the backend says so
    if not summary.model or summary.model != model:
        problems.append(f"model {summary.model!r}, the summary is written with {model!r}")
    return problems


def _sent_problems(summary: Summary, result: Any, calls: Sequence[SummarizerCall]) -> list[str]:
    """The summarizer calls, and that the stored model and text are the last call's."""
    problems = call_problems(result, calls)
    # The model that answered, as the backend reports it ("offline"), else the one sent.
    if calls and (calls[-1].answered or calls[-1].model) != summary.model:
        problems.append(f"stored model {summary.model!r}, sent {calls[-1].model!r}")
    if calls and calls[-1].text.strip() != summary.text:
        problems.append("the stored text is not the summarizer's answer")
    return problems


def _content_problems(summary: Summary, result: Any, previous_summary: Any) -> list[str]:
    """A non-blank active summary whose token count is its size, below what it replaced."""
    problems = []
    if not summary.text.strip():
        problems.append("blank summary text")
    if not summary.active:
        problems.append("new summary is not active")
    if summary.token_count != summary_size(summary.text, result.context.conversation):
        problems.append(f"summary token_count {summary.token_count} is not its size")
    replaced = replaced_tokens(result, previous_summary)
    if summary.token_count >= replaced:
        problems.append(
            f"a {summary.token_count}-token summary replaced only {replaced} tokens (no gain)"
        )
    return problems


def _range_problems(
    summary: Summary, archived: list[int], *, version: int, leading: bool
) -> list[str]:
    """A contiguous archived range the summary ends with, continuing the previous one
    (version 1: starting where the history starts, after the leading message)."""
    problems = []
    if archived != list(range(archived[0], archived[0] + len(archived))):
        problems.append(f"archived seqs not contiguous: {archived}")
    if summary.to_seq != archived[-1]:
        problems.append(f"to_seq {summary.to_seq}, newest archived is {archived[-1]}")
    previous = summary.previous
    if version == 1:
        if previous is not None:
            problems.append("version 1 has a previous summary")
        if summary.from_seq != int(leading) or archived[0] != int(leading):
            problems.append(
                f"version 1 covers from {summary.from_seq}, archived from "
                f"{archived[0]}; the history starts at {int(leading)}"
            )
    elif previous is None:
        problems.append(f"version {version} has no previous summary")
    else:
        if previous.version != version - 1:
            problems.append(f"previous is version {previous.version}, expected {version - 1}")
        if previous.active:
            problems.append("previous summary still active")
        if summary.from_seq != previous.from_seq:
            problems.append(f"from_seq {summary.from_seq} != previous {previous.from_seq}")
        if archived[0] != previous.to_seq + 1:
            problems.append(f"archived from {archived[0]}, previous ended at {previous.to_seq}")
    return problems


def _record_problems(summary: Summary, archived: list[int], attempt: Any) -> list[str]:
    """Exactly the archived messages linked to the summary, and its ``compacted`` attempt."""
    problems = []
    linked = sorted(Message.objects.filter(summary=summary).values_list("seq", flat=True))
    if linked != archived:
        problems.append(f"messages linked to the summary {linked} != archived {archived}")
    if (
        attempt is None
        or attempt.outcome != CompactionAttempt.Outcome.COMPACTED
        or attempt.summary_id != summary.pk
        or attempt.messages_archived != len(archived)
    ):
        problems.append("no matching 'compacted' attempt record")
    return problems


def no_gain_problems(
    result: Any,
    *,
    calls: Sequence[SummarizerCall],
    rejected: dict[int, int],
    previous_summary: Any,
) -> list[str]:
    """What is wrong with a ``no_gain`` skip (empty when nothing is): a skipped attempt
    recording the range; when the summarizer was called, a summary really not smaller than
    the archived messages plus the previous summary, for a range not rejected before
    (``rejected``: from_seq -> the furthest to_seq rejected, updated here); when it was
    not, a range already rejected. Nothing was written either way."""
    archived = [row.seq for row in result.archived or ()]
    if not archived:
        return ["no_gain without a range"]
    first, last = archived[0], archived[-1]
    problems = _skip_record_problems(result, first, last, previous_summary)
    seen = rejected.get(first, -1)
    if calls:
        problems += call_problems(result, calls)
        if last <= seen:
            problems.append(f"{first}..{last} sent again after no_gain up to {seen}")
        size = summary_size(calls[-1].text.strip(), result.context.conversation)
        replaced = replaced_tokens(result, previous_summary)
        if size < replaced:
            problems.append(f"a {size}-token summary of {replaced} tokens skipped as no_gain")
        rejected[first] = max(seen, last)
    elif last > seen:
        problems.append(f"{first}..{last} skipped as no_gain without a summarizer call")
    return problems


def _skip_record_problems(result: Any, first: int, last: int, previous_summary: Any) -> list[str]:
    """A skipped ``no_gain`` attempt recording ``first..last``, no summary returned, and
    the active summary left as it was."""
    problems = []
    attempt = result.attempt
    if (
        attempt is None
        or attempt.outcome != CompactionAttempt.Outcome.SKIPPED
        or attempt.reason != Reason.NO_GAIN
        or (attempt.from_seq, attempt.to_seq) != (first, last)
        or attempt.summary_id is not None
    ):
        problems.append(f"no skipped 'no_gain' attempt recording {first}..{last}")
    if result.summary is not None:
        problems.append("no_gain returned a summary")
    conversation = result.context.conversation
    active = Summary.objects.filter(conversation=conversation, active=True).first()
    if (active and active.pk) != (previous_summary and previous_summary.pk):
        problems.append("no_gain changed the active summary")
    return problems
