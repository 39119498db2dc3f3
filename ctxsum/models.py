"""Conversations, their messages, the summaries that replace old messages in the active
context, and the record of every compaction attempt."""

from __future__ import annotations

import json
import uuid
from typing import Any, TypeVar

from django.conf import settings
from django.db import models
from django.db.models import Q

from ctxsum import tokens
from ctxsum.policy import Reason

_Row = TypeVar("_Row")


class Role(models.TextChoices):
    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ctxsum_conversations"
    )
    title = models.CharField(max_length=200, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    # Primary chat model; also picks the tiktoken encoding. Blank: the settings' default.
    model = models.CharField(max_length=100, blank=True, default="")
    # Policy overrides; NULL means the settings' default (each replaces it as a whole).
    trigger = models.JSONField(null=True, blank=True)
    keep = models.JSONField(null=True, blank=True)
    # Hard ceiling on the active context's tokens; NULL means the settings' default.
    max_context_tokens = models.PositiveIntegerField(null=True, blank=True)

    # Counters that keep the hot path O(1); updated in the same transaction as the rows.
    next_seq = models.PositiveIntegerField(default=0)
    message_count = models.PositiveIntegerField(default=0)
    active_message_count = models.PositiveIntegerField(default=0)
    # Tokens of the active context's messages, the summary message and the facts block
    # included.
    active_tokens = models.PositiveIntegerField(default=0)
    # Tokens of the facts block alone (0: no block), part of active_tokens.
    facts_tokens = models.PositiveIntegerField(default=0)
    # What the stats read instead of counting the history: the archived messages and their
    # tokens, the summaries written, the compactions (rebuilds included) committed.
    archived_message_count = models.PositiveIntegerField(default=0)
    archived_tokens = models.PositiveBigIntegerField(default=0)
    summary_count = models.PositiveIntegerField(default=0)
    compaction_count = models.PositiveIntegerField(default=0)
    # Bumped on every change of the conversation or its context (an ETag for clients).
    revision = models.PositiveIntegerField(default=0)

    # The compaction lease: which worker is summarizing, and since when (renewed before every
    # summarizer call; abandoned once older than the lease time, see docs/architecture.md).
    lease_owner = models.CharField(max_length=64, blank=True, default="")
    leased_at = models.DateTimeField(null=True, blank=True)

    # What the conversation is about, in the owner's terms (a customer id, say): the facts of
    # a subject (Fact.subject) are shared by all of the owner's conversations naming it.
    subject = models.CharField(max_length=200, blank=True, default="")

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="ctxsum_conv_owner_created"),
            models.Index(
                fields=["owner", "subject"],
                condition=~Q(subject=""),
                name="ctxsum_conv_owner_subject",
            ),
        ]

    def __str__(self) -> str:
        return self.title or str(self.id)

    @property
    def context_tokens(self) -> int:
        """Tokens of a request carrying the active context (``active_tokens`` plus the
        reply priming every request pays)."""
        return tokens.context_tokens([self.active_tokens])

    @property
    def context_messages(self) -> int:
        """The active context's message count, from the counters alone: the active messages,
        a summary whenever a message left the context (archived, or a replaced system prompt:
        at worst one too many) and the facts block when it shows any."""
        left = self.message_count > self.active_message_count
        return self.active_message_count + int(left) + int(self.facts_tokens > 0)

    def update_from(self, other: Conversation) -> None:
        """Take every field value of ``other``, a later read of the same row: how services
        bring the instance they were given up to date without another query."""
        for model_field in self._meta.concrete_fields:
            setattr(self, model_field.attname, getattr(other, model_field.attname))


class MessageQuerySet(models.QuerySet["Message"]):
    def active(self) -> MessageQuerySet:
        """Messages of the active context: not archived, not replaced."""
        return self.filter(summary__isnull=True, replaced_at__isnull=True)

    def archived(self) -> MessageQuerySet:
        return self.filter(summary__isnull=False)

    def containing(self, words: str) -> MessageQuerySet:
        """Messages whose content holds ``words``, ignoring case. SQLite stores JSON with
        non-ASCII characters and quotes escaped (\\u00f1, \\"): that spelling matches too;
        PostgreSQL's jsonb reads back unescaped."""
        escaped = json.dumps(words)[1:-1]
        return self.filter(Q(content__icontains=words) | Q(content__icontains=escaped))


class Message(models.Model):
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    # Gapless per conversation, handed out under the conversation's row lock: the only order.
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=16, choices=Role.choices)
    # A string or a list of OpenAI content parts; NULL only on an assistant tool-call message.
    content = models.JSONField(null=True, blank=True)
    name = models.CharField(max_length=100, blank=True, default="")
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=255, blank=True, default="")
    # Provider-reply extras kept as given (refusal, annotations, audio, reasoning_content).
    extra = models.JSONField(default=dict, blank=True)
    token_count = models.PositiveIntegerField()
    # The leading system/developer message: always first in the context, never summarized.
    is_leading = models.BooleanField(default=False)
    # Set when PATCH {"system": ...} replaced this leading message; it stays in the transcript.
    replaced_at = models.DateTimeField(null=True, blank=True)
    # Set when the message was redacted: its content is the redaction marker since.
    redacted_at = models.DateTimeField(null=True, blank=True)
    # NULL while the message is in the active context; the summary that archived it after.
    summary = models.ForeignKey(
        "Summary", null=True, blank=True, on_delete=models.RESTRICT, related_name="messages"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = MessageQuerySet.as_manager()

    class Meta:
        ordering = ["conversation_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "seq"], name="ctxsum_message_seq_uniq"),
        ]
        indexes = [
            # The hot path: the active messages of one conversation in seq order.
            models.Index(
                fields=["conversation", "seq"],
                condition=Q(summary__isnull=True),
                name="ctxsum_msg_active_seq",
            ),
            # The current leading message of a conversation, wherever it stands.
            models.Index(
                fields=["conversation"],
                condition=Q(is_leading=True, replaced_at__isnull=True),
                name="ctxsum_msg_leading",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id}#{self.seq} {self.role}"

    def as_openai(self) -> dict[str, Any]:
        """The message as the chat completions API takes it: only the fields it has."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        message.update(self.extra)
        return message


class ToolCall(models.Model):
    """One tool call of an assistant message, indexed so a tool result finds its request
    with one query however long the conversation is."""

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="tool_call_index"
    )
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="tool_call_rows")
    seq = models.PositiveIntegerField()  # the message's seq, to find the nearest earlier request
    call_id = models.CharField(max_length=255)
    name = models.CharField(max_length=255)

    class Meta:
        indexes = [
            models.Index(fields=["conversation", "call_id", "seq"], name="ctxsum_toolcall_lookup"),
        ]

    def __str__(self) -> str:
        return f"{self.call_id} {self.name}"


def single(rows: models.QuerySet[Any, _Row]) -> _Row | None:
    """The row (or value) of a query that matches one at most, such as a conversation's
    active summary; None when none does. Unordered: ``first()`` sorts by version, and
    PostgreSQL may then read every version rather than the one-active index."""
    return next(iter(rows.order_by()[:1]), None)


class SummaryQuerySet(models.QuerySet["Summary"]):
    def stale(self, *, prompt_version: str, prompt_sha256: str) -> SummaryQuerySet:
        """Summaries written under another prompt than this one, or covering a message
        that was redacted since."""
        current = Q(prompt_version=prompt_version, prompt_sha256=prompt_sha256)
        return self.filter(~current | Q(covers_redacted=True))


class Summary(models.Model):
    class Origin(models.TextChoices):
        COMPACTION = "compaction"
        REBUILD = "rebuild"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="summaries"
    )
    version = models.PositiveIntegerField()
    text = models.TextField()
    prompt_version = models.CharField(max_length=64)
    prompt_sha256 = models.CharField(max_length=64)
    model = models.CharField(max_length=100, blank=True, default="")
    # Cumulative: from the first summarized message to the newest one this summary replaced.
    from_seq = models.PositiveIntegerField()
    to_seq = models.PositiveIntegerField()
    # The version this one was written from (a compaction extends it, a rebuild replaces
    # it). A foreign key, not one-to-one: after a revert, the next compaction extends the
    # restored version again, so a version can be the previous one of several.
    previous = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.RESTRICT, related_name="next"
    )
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    # Tokens of the summary as a context message (prefix included).
    token_count = models.PositiveIntegerField(default=0)
    active = models.BooleanField(default=True)
    # A compaction extends the previous version; a rebuild writes the whole range anew from
    # the archived originals and marks the version it replaced superseded.
    origin = models.CharField(max_length=16, choices=Origin.choices, default=Origin.COMPACTION)
    superseded = models.BooleanField(default=False)
    # Undone by conversation_revert: its archived messages are active again and its
    # previous version is the active one; it archives nothing and stays in the history.
    reverted = models.BooleanField(default=False)
    # A message this summary covers was redacted after it was written: rebuild it.
    covers_redacted = models.BooleanField(default=False)
    # The coverage check (ctxsum.coverage): the facts of the covered messages, each present or
    # missing in the text (NULL: not checked, for summaries older than the check), and the
    # share present (NULL when there were none, or not checked).
    coverage = models.FloatField(null=True, blank=True)
    coverage_facts = models.JSONField(null=True, blank=True)
    # Why the key facts of the summarizer's answer were not merged (unparseable, a backend
    # that returns none, …); blank when they were.
    facts_skipped = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SummaryQuerySet.as_manager()

    class Meta:
        ordering = ["conversation_id", "-version"]
        verbose_name_plural = "summaries"
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "version"], name="ctxsum_summary_version_uniq"
            ),
            models.UniqueConstraint(
                fields=["conversation"],
                condition=Q(active=True),
                name="ctxsum_summary_one_active",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id} v{self.version}"


class CompactionAttempt(models.Model):
    class Outcome(models.TextChoices):
        COMPACTED = "compacted"
        SKIPPED = "skipped"
        CONFLICT = "conflict"
        FAILED = "failed"
        REVERTED = "reverted"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="compaction_attempts"
    )
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    reason = models.CharField(max_length=64, blank=True, default="", choices=Reason.choices())
    error = models.TextField(blank=True, default="")
    summary = models.ForeignKey(
        Summary, null=True, blank=True, on_delete=models.SET_NULL, related_name="attempts"
    )
    tokens_before = models.PositiveIntegerField(default=0)
    tokens_after = models.PositiveIntegerField(default=0)
    messages_archived = models.PositiveIntegerField(default=0)
    # The seq range the attempt planned to archive (NULL when it planned nothing).
    from_seq = models.PositiveIntegerField(null=True, blank=True)
    to_seq = models.PositiveIntegerField(null=True, blank=True)
    forced = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["conversation", "-created_at"], name="ctxsum_attempt_conv"),
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id} {self.outcome}"


class IdempotencyKey(models.Model):
    """A request sent with an ``Idempotency-Key`` header, and the answer it got: a retry
    with the same key is answered from here (see docs/architecture.md, "Idempotency keys").

    One row per owner, conversation and key; the unique constraint decides which of two
    concurrent requests with the same key runs. ``token`` names the request that holds the
    claim (a new one when an abandoned claim is taken over); ``applied_at`` is set in the
    same transaction as the write of an append, so a write is never repeated, even when
    its answer was never stored.
    """

    class State(models.TextChoices):
        IN_PROGRESS = "in_progress"
        DONE = "done"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ctxsum_idempotency_keys"
    )
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="idempotency_keys"
    )
    key = models.CharField(max_length=255)
    # What the request was: which operation (method and view), and the SHA-256 of the
    # method, the operation and the raw body together.
    operation = models.CharField(max_length=100)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.IN_PROGRESS)
    token = models.CharField(max_length=32)
    claimed_at = models.DateTimeField()
    applied_at = models.DateTimeField(null=True, blank=True)
    # The answer, once there is one: its status and its data as JSON text (text, not
    # jsonb, so a replay answers the keys in the order the first answer had them).
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.TextField(blank=True, default="")
    answered_at = models.DateTimeField(null=True, blank=True)
    # When the key was claimed first; it expires IDEMPOTENCY_KEY_SECONDS later.
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "conversation", "key"], name="ctxsum_idempotency_key_uniq"
            ),
        ]
        indexes = [models.Index(fields=["created_at"], name="ctxsum_idempotency_created")]

    def __str__(self) -> str:
        return f"{self.conversation_id} {self.key}"
