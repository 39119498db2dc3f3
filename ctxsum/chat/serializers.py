"""The chat turn's REST shapes: its input (the options each checked by the service) and its
answer (the stored messages, the turn's usage, the compaction before the call, the stats)."""

from __future__ import annotations

from functools import partial
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ctxsum import selectors
from ctxsum.api import schema
from ctxsum.api.serializers import (
    AutoCompactionOutputSerializer,
    MessageOutputSerializer,
    StrictSerializer,
    StringField,
    checked_by_service,
    read_after_write,
)
from ctxsum.chat import schema as chat_schema
from ctxsum.chat.models import ChatTurn


class ChatInputSerializer(StrictSerializer):
    """A chat turn: ``message`` is required (null continues after tool results); the options
    are passed on to the model, each checked by the service; null leaves one unset."""

    message = checked_by_service(chat_schema.TurnMessage)(allow_null=True)
    stream = serializers.BooleanField(default=False)
    model = StringField(required=False, allow_null=True)
    tools = checked_by_service(chat_schema.Tools)(required=False, allow_null=True)
    tool_choice = checked_by_service(chat_schema.ToolChoice)(required=False, allow_null=True)
    # Taken as JSON, not coerced: "0.5" or "100" is refused, not read as a number.
    temperature = checked_by_service(chat_schema.Temperature)(required=False, allow_null=True)
    max_completion_tokens = checked_by_service(chat_schema.MaxCompletionTokens)(
        required=False, allow_null=True
    )


class ChatUsageOutputSerializer(serializers.ModelSerializer[ChatTurn]):
    """A stored turn's record: the model that answered, the attempts it took, and the usage
    the provider reported (null where it reported none)."""

    class Meta:
        model = ChatTurn
        fields = [
            "model",
            "requested_model",
            "attempts",
            "fallbacks",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "total_tokens",
            "latency_ms",
            "finish_reason",
            "streamed",
        ]
        read_only_fields = fields


class ChatOutputSerializer(serializers.Serializer[Any]):
    """What a chat turn stored (``services.ChatResult``): the new message and the reply, the
    turn's usage, the compaction before the call (null when none was due), and the
    conversation's stats after it (null when they could not be read: the turn is stored)."""

    messages = MessageOutputSerializer(many=True)
    usage = ChatUsageOutputSerializer(source="turn")
    compaction = AutoCompactionOutputSerializer(allow_null=True)
    stats = serializers.SerializerMethodField()

    @extend_schema_field(schema.ConversationStats(allow_null=True))
    def get_stats(self, result: Any) -> dict[str, int] | None:
        conversation = result.conversation
        stats = partial(selectors.conversation_stats, conversation=conversation)
        return read_after_write("stats", conversation.pk, stats)
