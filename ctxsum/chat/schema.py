"""The OpenAPI description of the chat turn (``ctxsum.api.schema`` holds the core's): its
options' schemas, its streamed answer, its 429, and the keys it adds to a conversation's
stats."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from ctxsum import message_schema
from ctxsum.api.schema import Error, RawSchema, error_answer, stats_keys
from ctxsum.api.schema import _or_null as or_null
from ctxsum.message_schema import NULL, closed, const, string

# A streamed answer: server-sent events, each one as a client parses it (its event name,
# "message" when it has none, and its data), the data's forms described in words.
SERVER_SENT_EVENTS = OpenApiResponse(
    response={
        "type": "object",
        "properties": {
            "event": {"type": "string", "enum": ["message", "ctxsum", "error"]},
            "data": {"type": "string"},
        },
        "required": ["data"],
    },
    description="Server-sent events: `data: {chat.completion.chunk}` for each chunk of the "
    "model's answer, then `event: ctxsum` with this operation's JSON answer as its data, then "
    '`data: [DONE]`; or `event: error` with `{"detail", "code"}` when the turn fails '
    "after its first chunk (nothing is stored).",
)


# "function", the one tool type; wrapped so that drf-spectacular's enum hook leaves it alone
# (ToolCall's own type enum already has the name it would take).
FUNCTION_TYPE = {"allOf": [const("function")]}
FUNCTION_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}


class TurnMessage(RawSchema):
    """A chat turn's new message: a user message or a tool result; null continues after
    results appended through the messages endpoint."""

    schema = {"oneOf": [message_schema.ref("UserMessage"), message_schema.ref("ToolMessage"), NULL]}


class Tools(RawSchema):
    """The tools the model may call, as OpenAI's chat completions API takes them."""

    _function = closed(
        {
            "name": FUNCTION_NAME,
            "description": string(),
            "parameters": {"type": "object"},
            "strict": or_null({"type": "boolean"}),
        },
        required=("name",),
    )
    _tool = closed({"type": FUNCTION_TYPE, "function": _function}, ("type", "function"))
    schema = or_null({"type": "array", "minItems": 1, "maxItems": 128, "items": _tool})


class ToolChoice(RawSchema):
    """Whether and which tool the model must call."""

    _named = closed(
        {"type": FUNCTION_TYPE, "function": closed({"name": FUNCTION_NAME}, ("name",))},
        required=("type", "function"),
    )
    schema = {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, _named, NULL]}


class Temperature(RawSchema):
    """Sampling temperature, passed on to the model."""

    schema = or_null({"type": "number", "minimum": 0, "maximum": 2})


class MaxCompletionTokens(RawSchema):
    """The reply's token cap, passed on to the model."""

    schema = or_null({"type": "integer", "minimum": 1, "maximum": 2**31 - 1})


class TooManyCalls(Error):
    """A chat turn over a limit of model calls (``call_limit_reached``)."""

    scope = serializers.ChoiceField(
        choices=[("conversation", "conversation"), ("user_day", "user_day")],
        help_text="Which limit: the conversation's, or the user's for the (UTC) day.",
    )


def declare() -> None:
    """The chat turn's 429 answer, and its keys of a conversation's stats (after the
    core's, as ``ctxsum.chat.selectors.chat_usage`` reads them)."""
    error_answer(429, TooManyCalls, "A limit of model calls is reached (call_limit_reached).")
    stats_keys(
        chat_turns=serializers.IntegerField(min_value=0, help_text="Chat turns stored."),
        prompt_tokens=serializers.IntegerField(
            min_value=0, help_text="Of every chat turn, as the provider reported them."
        ),
        completion_tokens=serializers.IntegerField(min_value=0),
        cached_tokens=serializers.IntegerField(min_value=0),
    )
