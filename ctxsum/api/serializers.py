"""The REST API's shapes, in one style: an input serializer per write (it checks the
request's structure; the service checks its meaning) and an output serializer per answer
(fed by the views with what services and selectors return)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ctxsum import selectors
from ctxsum.api import schema
from ctxsum.exceptions import FailureCause, Problem
from ctxsum.models import Conversation, Message, Summary
from ctxsum.policy import MAX_CONTEXT_TOKENS_LIMIT, Reason
from ctxsum.services import MAX_SUBJECT_CHARS
from ctxsum.validation import NOT_A_STRING, UNKNOWN_FIELD, field_name

logger = logging.getLogger("ctxsum.api")
T = TypeVar("T")

POLICY_KEYS = ("trigger", "keep", "max_context_tokens")
READ_AFTER_WRITE_FAILED = (
    "Conversation %s: its write committed, but %s could not be read for the answer; "
    "answered without it (null)."
)
# The service's words for the same rule (ctxsum.services.conversations.TOO_LONG), in DRF's template.
MAX_CHARACTERS = _("Must be at most {max_length} characters.")


def read_after_write(part: str, conversation_id: Any, read: Callable[[], T]) -> T | None:
    """``read()``, a part of a write's answer read after the write committed (stats, the
    context): None when it fails, logged with the conversation's id. The write is stored:
    its answer is a success without that part, never an error that says otherwise."""
    try:
        return read()
    except Exception:
        logger.exception(READ_AFTER_WRITE_FAILED, conversation_id, part)
        return None


# --------------------------------------------------------------------------- input


class StrictSerializer(serializers.Serializer[Any]):
    """Rejects fields it does not declare, naming each one."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                unknown_field = Problem(UNKNOWN_FIELD, "unknown_field")
                errors = {field_name(name): [unknown_field] for name in unknown}
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class StringField(serializers.CharField):
    """A CharField that takes only JSON strings: DRF's own turns 123 into "123"."""

    default_error_messages = {"invalid": NOT_A_STRING, "max_length": MAX_CHARACTERS}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# Text a write may leave out, taken as sent: blank, and with its whitespace.
OptionalText = partial(StringField, allow_blank=True, trim_whitespace=False, required=False)


def checked_by_service(described_as: Any) -> type[serializers.JSONField]:
    """A field of JSON taken as it comes, for the service to check (with errors that name
    the index and field), that the OpenAPI document describes as ``described_as``."""
    name = f"{getattr(described_as, '__name__', 'JSON')}Field"
    field: type[serializers.JSONField] = type(name, (serializers.JSONField,), {})
    return extend_schema_field(described_as)(field)


MessageField = checked_by_service(schema.ChatMessage)
MessageListField = checked_by_service(schema.MessageList)
TriggerField = checked_by_service(schema.Trigger)  # {"messages": N, "tokens": N}, either or both
KeepField = checked_by_service(schema.Keep)  # {"messages": N} or {"tokens": N}
# A positive integer the column can hold, or null.
MaxContextTokensField = checked_by_service(
    {"type": "integer", "minimum": 1, "maximum": MAX_CONTEXT_TOKENS_LIMIT}
)


class PolicyInputSerializer(StrictSerializer):
    """Overrides of the settings' policy; null resets one to the default. The rules are
    checked by the service, against each other and the defaults."""

    trigger = TriggerField(required=False, allow_null=True)
    keep = KeepField(required=False, allow_null=True)
    max_context_tokens = MaxContextTokensField(required=False, allow_null=True)


class ConversationInputSerializer(StrictSerializer):
    """PATCH of a conversation: every field optional. Lengths are the service's to check."""

    title = OptionalText()
    system = OptionalText()
    metadata = serializers.DictField(required=False)
    model = OptionalText()
    subject = OptionalText(
        max_length=MAX_SUBJECT_CHARS,
        help_text="What the conversation is about, in your terms (a customer id, say): the "
        "facts of this subject are shared by your conversations naming it. Blank: none.",
    )
    policy = PolicyInputSerializer(required=False, allow_null=True)  # null: all defaults


class ConversationCreateInputSerializer(ConversationInputSerializer):
    messages = serializers.ListField(child=MessageField(), required=False)


class MessageBatchInputSerializer(StrictSerializer):
    """``{"messages": [...]}``; each message is checked by the service, which names the
    index and field of every error. A lone message object is taken as a batch of one."""

    messages = MessageListField()


class CompactInputSerializer(StrictSerializer):
    force = serializers.BooleanField(default=False)
    dry_run = serializers.BooleanField(default=False)


class EmptyInputSerializer(StrictSerializer):
    """A body with no fields: ``{}``, or no body at all."""


# --------------------------------------------------------------------------- output


class ApiRootOutputSerializer(serializers.Serializer[Any]):
    conversations = serializers.URLField()


class SummaryOutputSerializer(serializers.ModelSerializer[Summary]):
    covers = schema.Covers(source="*", read_only=True)
    previous_version = serializers.SerializerMethodField()
    stale = serializers.SerializerMethodField()

    class Meta:
        model = Summary
        fields = [
            "version",
            "text",
            "prompt_version",
            "prompt_sha256",
            "model",
            "covers",
            "previous_version",
            "input_tokens",
            "output_tokens",
            "active",
            "origin",
            "superseded",
            "reverted",
            "stale",
            "coverage",
            "created_at",
        ]
        # Output only: every field is in every answer.
        read_only_fields = fields

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_previous_version(self, summary: Summary) -> int | None:
        """The version it extends; null for the first."""
        return _version_after_write(summary, "previous", "the previous version")

    def get_stale(self, summary: Summary) -> bool:
        return selectors.summary_is_stale(summary)


def _version_after_write(row: Any, relation: str, part: str) -> int | None:
    """The version of the summary ``row.<relation>`` points to (read when not loaded yet);
    null when none, or when it could not be read after a write committed (logged)."""
    if getattr(row, f"{relation}_id") is None:
        return None
    return read_after_write(part, row.conversation_id, lambda: getattr(row, relation).version)


class MessageOutputSerializer(serializers.ModelSerializer[Message]):
    """A stored message: the OpenAI message plus where it stands in the conversation."""

    archived = serializers.SerializerMethodField()
    summary_version = serializers.SerializerMethodField()
    replaced = serializers.SerializerMethodField()

    class Meta:
        model = Message
        fields = ["seq", "token_count", "archived", "summary_version", "replaced", "created_at"]
        read_only_fields = fields

    def to_representation(self, message: Message) -> dict[str, Any]:
        return {**message.as_openai(), **super().to_representation(message)}

    def get_archived(self, message: Message) -> bool:
        return message.summary_id is not None

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_summary_version(self, message: Message) -> int | None:
        """The version that archived it; null while it is active."""
        return _version_after_write(message, "summary", "the version that archived it")

    def get_replaced(self, message: Message) -> bool:
        return message.replaced_at is not None


class ConversationOutputSerializer(serializers.ModelSerializer[Conversation]):
    policy = serializers.SerializerMethodField()
    effective_policy = serializers.SerializerMethodField()
    active_tokens = serializers.IntegerField(source="context_tokens")

    class Meta:
        model = Conversation
        fields = [
            "id",
            "title",
            "metadata",
            "model",
            "subject",
            "policy",
            "effective_policy",
            "message_count",
            "active_message_count",
            "active_tokens",
            "facts_tokens",
            "revision",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(schema.Policy)
    def get_policy(self, conversation: Conversation) -> dict[str, Any]:
        return {key: getattr(conversation, key) for key in POLICY_KEYS}

    @extend_schema_field(schema.EffectivePolicy)
    def get_effective_policy(self, conversation: Conversation) -> dict[str, Any]:
        return selectors.conversation_effective_policy(conversation)


class ContextOutputSerializer(serializers.Serializer[Any]):
    """The active context (a ``selectors.ActiveContext``), as it would be sent now."""

    messages = serializers.ListField(child=MessageField())
    token_count = serializers.IntegerField()
    summary = SummaryOutputSerializer(allow_null=True)
    revision = serializers.IntegerField()
    over_max_context_tokens = serializers.BooleanField()


class ConversationDetailOutputSerializer(ConversationOutputSerializer):
    """One conversation with its system prompt, active summary and stats; the view passes
    its active context as ``context["active"]``."""

    system = serializers.SerializerMethodField()
    summary = serializers.SerializerMethodField()
    stats = serializers.SerializerMethodField()

    class Meta(ConversationOutputSerializer.Meta):
        fields = [*ConversationOutputSerializer.Meta.fields, "system", "summary", "stats"]
        read_only_fields = fields

    @extend_schema_field(schema.SystemPrompt)
    def get_system(self, conversation: Conversation) -> Any:
        active: selectors.ActiveContext = self.context["active"]
        return active.leading_row.content if active.leading_row else None

    @extend_schema_field(SummaryOutputSerializer(allow_null=True))
    def get_summary(self, conversation: Conversation) -> dict[str, Any] | None:
        summary = self.context["active"].summary
        return SummaryOutputSerializer(summary).data if summary else None

    @extend_schema_field(schema.ConversationStats)
    def get_stats(self, conversation: Conversation) -> dict[str, int]:
        active: selectors.ActiveContext = self.context["active"]
        return selectors.conversation_stats(conversation=conversation, context=active)


class AutoCompactionOutputSerializer(serializers.Serializer[Any]):
    """What the compaction after an append did (``services.AutoCompaction``)."""

    compacted = serializers.BooleanField()
    reason = serializers.ChoiceField(choices=Reason.choices())
    summary_version = serializers.IntegerField(allow_null=True)
    over_trigger = serializers.BooleanField()
    detail = serializers.CharField(allow_blank=True)
    cause = serializers.ChoiceField(
        choices=["", *map(str, FailureCause)],
        allow_blank=True,
        help_text="Why the summarizer failed, for a summarizer_error (as a 502's cause); "
        "blank otherwise.",
    )


class LeftOutWhenNone(serializers.Serializer[Any]):
    """An answer that leaves the keys ``left_out`` out rather than send them as null."""

    left_out: tuple[str, ...] = ()

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = super().to_representation(instance)
        return {k: v for k, v in data.items() if k not in self.left_out or v is not None}


class AppendOutputSerializer(LeftOutWhenNone):
    """What an append stored (``services.Appended``); ``compaction`` only with AUTO_COMPACT."""

    left_out = ("compaction",)
    messages = MessageOutputSerializer(many=True)
    compaction = AutoCompactionOutputSerializer(allow_null=True)


class CompactionOutputSerializer(LeftOutWhenNone):
    """What a compaction did (``services.CompactionResult``); ``plan`` unless the trigger
    was not reached."""

    left_out = ("plan",)
    compacted = serializers.BooleanField()
    reason = serializers.ChoiceField(choices=[str(r) for r in schema.COMPACTION_REASONS])
    over_trigger = serializers.BooleanField()
    summary = SummaryOutputSerializer(allow_null=True)
    # DRF takes declared fields off the class, so this does not shadow Serializer.context.
    # Null only when it could not be read after a compaction that committed.
    context = ContextOutputSerializer(allow_null=True)  # type: ignore[assignment]
    plan = serializers.SerializerMethodField()

    @extend_schema_field(schema.CompactionPlan)
    def get_plan(self, result: Any) -> dict[str, Any] | None:
        plan, archived = result.plan, result.archived
        if plan is None or result.reason == Reason.BELOW_TRIGGER:
            return None
        return {
            "archive": {
                "count": len(archived),
                "from_seq": archived[0].seq if archived else None,
                "to_seq": archived[-1].seq if archived else None,
            },
            "keep_count": plan.kept,
            "tokens_before": plan.tokens_before,
            "tokens_after": plan.tokens_after,
        }


class ContextAfterWrite(serializers.Serializer[Any]):
    """An answer with the context after a write, which the view passes; a subclass declares
    ``context`` (DRF takes declared fields off the class: it does not shadow ``self.context``)."""

    @extend_schema_field(ContextOutputSerializer(allow_null=True))
    def get_context(self, result: Any) -> dict[str, Any] | None:
        active = self.context["active"]
        return None if active is None else ContextOutputSerializer(active).data


class RebuildOutputSerializer(ContextAfterWrite):
    """What a rebuild did (``services.Rebuilt``) and the context after it; the view passes
    the context as ``context["active"]`` (None: it could not be read, ``context`` is null)."""

    rebuilt = serializers.BooleanField()
    reason = serializers.ChoiceField(choices=[str(r) for r in schema.REBUILD_REASONS])
    summary = SummaryOutputSerializer(allow_null=True)
    replaced_version = serializers.IntegerField(source="replaced.version", allow_null=True)
    context = serializers.SerializerMethodField()  # type: ignore[assignment]


class RevertOutputSerializer(ContextAfterWrite):
    """What a revert did (``services.Reverted``) and the context after it; the view passes
    the context as ``context["active"]`` (None: it could not be read, ``context`` is null)."""

    reverted = serializers.BooleanField()
    reason = serializers.ChoiceField(choices=[str(r) for r in schema.REVERT_REASONS])
    reverted_version = serializers.IntegerField(source="reverted_summary.version")
    messages_restored = serializers.SerializerMethodField()
    summary = SummaryOutputSerializer(allow_null=True)
    context = serializers.SerializerMethodField()  # type: ignore[assignment]

    def get_messages_restored(self, reverted: Any) -> int:
        return len(reverted.restored)
