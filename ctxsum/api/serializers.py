"""Request validation and response shapes of the REST API."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ctxsum import tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.models import Conversation, Message, Summary

UNKNOWN_FIELD = "Unknown field."
POLICY_KEYS = ("trigger", "keep", "max_context_tokens")


class StrictSerializer(serializers.Serializer):
    """Rejects fields it does not declare, naming each one."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({field: [UNKNOWN_FIELD] for field in unknown})
        return super().to_internal_value(data)


class StringField(serializers.CharField):
    """A CharField that takes only JSON strings: DRF's own turns 123 into "123"."""

    default_error_messages = {"invalid": "Must be a string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class PolicyField(serializers.JSONField):
    """``{"trigger": {...} or null, "keep": {...} or null, "max_context_tokens": N or null}``;
    the rules are checked by the service against the settings' defaults."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                "Must be an object with trigger, keep and/or max_context_tokens."
            )
        unknown = sorted(set(data) - set(POLICY_KEYS))
        if unknown:
            raise serializers.ValidationError(f"Unknown key(s): {', '.join(unknown)}.")
        return data


class ConversationWriteSerializer(StrictSerializer):
    title = StringField(max_length=200, allow_blank=True, required=False)
    system = StringField(allow_blank=True, trim_whitespace=False, required=False)
    metadata = serializers.DictField(required=False)
    model = StringField(max_length=100, allow_blank=True, required=False)
    policy = PolicyField(required=False)


class ConversationCreateSerializer(ConversationWriteSerializer):
    messages = serializers.ListField(child=serializers.JSONField(), required=False)


class CompactSerializer(StrictSerializer):
    force = serializers.BooleanField(default=False)
    dry_run = serializers.BooleanField(default=False)


def effective_policy(conversation: Conversation) -> dict[str, Any]:
    return {
        "trigger": conversation.trigger or ctxsum_settings.TRIGGER,
        "keep": conversation.keep or ctxsum_settings.KEEP,
        "max_context_tokens": (
            conversation.max_context_tokens or ctxsum_settings.MAX_CONTEXT_TOKENS
        ),
    }


class ConversationSerializer(serializers.ModelSerializer):
    policy = serializers.SerializerMethodField()
    effective_policy = serializers.SerializerMethodField()
    active_tokens = serializers.SerializerMethodField()

    class Meta:
        model = Conversation
        fields = [
            "id",
            "title",
            "metadata",
            "model",
            "policy",
            "effective_policy",
            "message_count",
            "active_message_count",
            "active_tokens",
            "revision",
            "created_at",
            "updated_at",
        ]

    def get_policy(self, conversation: Conversation) -> dict[str, Any]:
        return {
            "trigger": conversation.trigger,
            "keep": conversation.keep,
            "max_context_tokens": conversation.max_context_tokens,
        }

    def get_effective_policy(self, conversation: Conversation) -> dict[str, Any]:
        return effective_policy(conversation)

    def get_active_tokens(self, conversation: Conversation) -> int:
        return tokens.context_tokens([conversation.active_tokens])


def message_data(message: Message) -> dict[str, Any]:
    """A stored message: the OpenAI message plus where it stands in the conversation."""
    return {
        **message.as_openai(),
        "seq": message.seq,
        "token_count": message.token_count,
        "archived": message.summary_id is not None,
        "summary_version": message.summary.version if message.summary_id else None,
        "replaced": message.replaced_at is not None,
        "created_at": serializers.DateTimeField().to_representation(message.created_at),
    }


def summary_data(summary: Summary | None) -> dict[str, Any] | None:
    if summary is None:
        return None
    return {
        "version": summary.version,
        "text": summary.text,
        "prompt_version": summary.prompt_version,
        "prompt_sha256": summary.prompt_sha256,
        "model": summary.model,
        "covers": {"from_seq": summary.from_seq, "to_seq": summary.to_seq},
        "previous_version": summary.previous.version if summary.previous_id else None,
        "input_tokens": summary.input_tokens,
        "output_tokens": summary.output_tokens,
        "active": summary.active,
        "created_at": serializers.DateTimeField().to_representation(summary.created_at),
    }
