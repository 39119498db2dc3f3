"""Reads: the active context, the transcript, summaries and stats."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from ctxsum.conf import ctxsum_settings
from ctxsum.hooks import Block, context_blocks, contributed_stats
from ctxsum.layout import LEADING, SUMMARY, ContextLayout, Part, layout_of
from ctxsum.models import Conversation, Message, Summary, SummaryQuerySet, single
from ctxsum.policy import Policy, default_ceiling, parse_policy
from ctxsum.threads import database_sync_to_async

# The reads docs/guide/python-api.md documents, the context's type, and the reads the
# REST layer and the admin also use.
__all__ = [
    "ActiveContext",
    "acontext_get",
    "active_summary_version",
    "context_get",
    "conversation_effective_policy",
    "conversation_list",
    "conversation_policy",
    "conversation_stats",
    "current_prompt",
    "effective_policy",
    "stale_summaries",
    "summary_is_stale",
    "summary_list",
    "summary_message",
    "summary_withheld",
    "transcript_list",
]

# A summary's coverage check: the facts of what its summarizer call was given (a few kB);
# only a compaction writing the next version and the admin's summary page read it.
SUMMARY_HEAVY = ("coverage_facts",)
# What a summary read with its previous version leaves out: of the previous one, all but
# what the REST answer says of it (its version).
_DEFERRED = (*SUMMARY_HEAVY, *(f"previous__{name}" for name in (*SUMMARY_HEAVY, "text")))


def prompt_sha256(prompt: str) -> str:
    """The fingerprint a summary records of the PROMPT that wrote it."""
    return hashlib.sha256(prompt.encode()).hexdigest()


def current_prompt() -> dict[str, str]:
    """What a summary written now records of its prompt: version and fingerprint."""
    return {
        "prompt_version": ctxsum_settings.PROMPT_VERSION,
        "prompt_sha256": prompt_sha256(ctxsum_settings.PROMPT),
    }


def summary_is_stale(summary: Summary) -> bool:
    """Whether ``summary`` was written under another prompt than the current one (its
    version or its text), or covers a message redacted since (``SummaryQuerySet.stale``
    as a test of one row)."""
    written = {"prompt_version": summary.prompt_version, "prompt_sha256": summary.prompt_sha256}
    return summary.covers_redacted or written != current_prompt()


def summary_withheld(*, conversation: Conversation) -> bool:
    """Whether the active summary was withheld after a redaction (docs/architecture.md,
    invariant f): its text is a notice until a rebuild writes it anew. One query."""
    summaries = Summary.objects.using(conversation._state.db)
    return summaries.filter(conversation=conversation, active=True, covers_redacted=True).exists()


def stale_summaries() -> SummaryQuerySet:
    """The active summaries that are stale: their conversations want a rebuild."""
    return Summary.objects.filter(active=True).stale(**current_prompt())


def summary_message(text: str) -> dict[str, Any]:
    """A summary's text as it enters the context: a *user* message, so generated prose
    never gains system authority."""
    return {"role": "user", "content": f"{ctxsum_settings.SUMMARY_PREFIX}\n\n{text}"}


def effective_policy(*, trigger: Any, keep: Any, max_context_tokens: Any) -> dict[str, Any]:
    """The policy in force for these overrides: each one that is None (not set) is the
    settings' default, and each one that is set replaces its default as a whole."""
    return {
        "trigger": ctxsum_settings.TRIGGER if trigger is None else trigger,
        "keep": ctxsum_settings.KEEP if keep is None else keep,
        "max_context_tokens": (
            ctxsum_settings.MAX_CONTEXT_TOKENS if max_context_tokens is None else max_context_tokens
        ),
    }


def conversation_effective_policy(conversation: Conversation) -> dict[str, Any]:
    """The JSON form of the policy in force for ``conversation``."""
    return effective_policy(
        trigger=conversation.trigger,
        keep=conversation.keep,
        max_context_tokens=conversation.max_context_tokens,
    )


def conversation_policy(conversation: Conversation) -> Policy:
    """The policy in force for ``conversation``; with no ceiling set, its model's default."""
    values = conversation_effective_policy(conversation)
    model = conversation.model or ctxsum_settings.DEFAULT_MODEL
    values["max_context_tokens"] = values["max_context_tokens"] or default_ceiling(model)
    return parse_policy(**values)


@dataclass(kw_only=True)
class ActiveContext:
    """What would be sent to the model now (``messages``, ``tokens``), its layout, and the
    rows it was read from."""

    conversation: Conversation
    leading_row: Message | None
    summary: Summary | None
    body_rows: list[Message]  # the active messages after the pinned parts, by seq
    layout: ContextLayout
    messages: list[dict[str, Any]] = field(default_factory=list)
    # The contributed blocks (ctxsum.hooks), in context order.
    blocks: list[Block] = field(default_factory=list)

    def shown(self, kind: str) -> list[Any]:
        """What the block ``kind`` shows (empty: the context has no such block)."""
        return next((list(block.shows) for block in self.blocks if block.kind == kind), [])

    @property
    def rows(self) -> list[Message]:
        """The active messages: the leading one first, then the body."""
        return [*filter(None, [self.leading_row]), *self.body_rows]

    @property
    def body(self) -> list[dict[str, Any]]:
        """The body's messages as sent."""
        return self.messages[len(self.layout.pinned) :]

    @property
    def tokens(self) -> list[int]:
        """Each message's tokens, as sent."""
        return [*(part.tokens for part in self.layout.pinned), *self.layout.body_tokens]

    @property
    def token_count(self) -> int:
        return self.layout.token_count

    @property
    def revision(self) -> int:
        return self.conversation.revision

    @property
    def max_context_tokens(self) -> int | None:
        """The hard ceiling on the context's tokens, if the policy sets one."""
        ceiling: int | None = conversation_effective_policy(self.conversation)["max_context_tokens"]
        return ceiling

    @property
    def over_max_context_tokens(self) -> bool:
        ceiling = self.max_context_tokens
        return ceiling is not None and self.token_count > ceiling


def context_get(*, conversation: Conversation) -> ActiveContext:
    """The active context: [leading system message] + [summary] + [contributed blocks: the
    key facts block] + active messages in seq order, in OpenAI format, and its layout. Two
    queries however long the conversation is (the summary, the messages) and each block's
    (the facts: one)."""
    summary = single(
        Summary.objects.filter(conversation=conversation, active=True)
        .select_related("previous")
        .defer(*_DEFERRED)
    )
    rows = _active_rows(conversation, summary)
    leading = next((row for row in rows if row.is_leading), None)
    body = [row for row in rows if not row.is_leading]
    pinned: list[tuple[Part, dict[str, Any]]] = []
    if leading is not None:
        pinned.append((Part(LEADING, leading.token_count), leading.as_openai()))
    if summary is not None:
        pinned.append((Part(SUMMARY, summary.token_count), summary_message(summary.text)))
    # Each block as it stands, counted now: not from ``facts_tokens``, which this instance
    # may hold from before the facts' last change.
    blocks = context_blocks(conversation)
    pinned += [(Part(block.kind, block.tokens), block.message) for block in blocks]
    return ActiveContext(
        conversation=conversation,
        leading_row=leading,
        summary=summary,
        body_rows=body,
        layout=layout_of(
            [part for part, _ in pinned], [(row.seq, row.token_count) for row in body]
        ),
        messages=[message for _, message in pinned] + [row.as_openai() for row in body],
        blocks=blocks,
    )


async def acontext_get(*, conversation: Conversation) -> ActiveContext:
    """``context_get`` for async code, run in the thread that serves the database."""
    context: ActiveContext = await database_sync_to_async(context_get)(conversation=conversation)
    return context


def _active_rows(conversation: Conversation, summary: Summary | None) -> list[Message]:
    """The active messages in seq order, read in O(their number) whatever the table holds.

    A compaction archives the oldest messages of the body, so the active body is what
    follows the summary's range: a range of the (conversation, seq) index, which the
    planner keeps using however many active rows other conversations have. The leading
    message, wherever it stands, comes from its own index.
    """
    active = Message.objects.filter(conversation=conversation).active()
    if summary is None:
        return list(active.order_by("seq"))
    # Unordered parts (no default ordering either): the union as a whole is ordered.
    body = active.filter(seq__gt=summary.to_seq).order_by()
    leading = active.filter(is_leading=True, seq__lte=summary.to_seq).order_by()
    return list(body.union(leading, all=True).order_by("seq"))


def active_summary_version(*, conversation: Conversation) -> int | None:
    """The version of the conversation's active summary (None: it has none), the one a
    revert undoes."""
    active = Summary.objects.filter(conversation=conversation, active=True)
    version: int | None = single(active.values_list("version", flat=True))
    return version


def conversation_list(*, owner: Any) -> QuerySet[Conversation]:
    return newest_first(Conversation.objects.filter(owner=owner))


def newest_first(conversations: QuerySet[Conversation]) -> QuerySet[Conversation]:
    """``conversations`` in the order the lists show them: the newest first."""
    # pk breaks ties, so pages neither repeat nor skip conversations created together.
    return conversations.order_by("-created_at", "-pk")


def transcript_list(*, conversation: Conversation) -> QuerySet[Message]:
    """Every message, archived and replaced ones included, in seq order, each with the
    summary that archived it (its version; not its text or coverage check, which would be
    read again for every message it archived)."""
    return (
        Message.objects.filter(conversation=conversation)
        .select_related("summary")
        .defer("summary__text", "summary__coverage_facts")
        .order_by("seq")
    )


def summary_list(*, conversation: Conversation) -> QuerySet[Summary]:
    """Every version, newest first, each with its previous one's version (not its text or
    coverage check)."""
    summaries = Summary.objects.filter(conversation=conversation)
    return summaries.select_related("previous").defer(*_DEFERRED)


def conversation_stats(
    *, conversation: Conversation, context: ActiveContext | None = None
) -> dict[str, int]:
    """Counts and token totals of one conversation, from its counters, then those the
    optional apps add (``ctxsum.hooks.contribute_stats``: the chat turns' usage). One query
    for the active summary's tokens, none when given the ``context`` it was read with."""
    if context is None:
        active = Summary.objects.filter(conversation=conversation, active=True)
        summary_tokens = single(active.values_list("token_count", flat=True)) or 0
    else:
        summary_tokens = context.summary.token_count if context.summary else 0
    return {
        "message_count": conversation.message_count,
        "active_message_count": conversation.active_message_count,
        "archived_message_count": conversation.archived_message_count,
        "active_tokens": conversation.context_tokens,
        "summary_count": conversation.summary_count,
        "compaction_count": conversation.compaction_count,
        "tokens_saved": max(0, conversation.archived_tokens - summary_tokens),
        **contributed_stats(conversation),
    }
