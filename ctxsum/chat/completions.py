"""What a chat turn sends to the model and makes of its answer: pure, no ORM, no I/O. The
turn's message and options are checked field by field, so a bad one is a 400 naming it,
never a provider error or a 500; a streamed reply is put together from its chunks.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from ctxsum.exceptions import MessagesInvalid
from ctxsum.validation import clean_message, field_name, unstorable

# Roles a turn's new message may have: a user message, or a tool result the model goes on
# from. System, developer and assistant messages are appended through the messages endpoint.
TURN_ROLES = ("user", "tool")
TOOL_CHOICES = ("none", "auto", "required")
MAX_TOOLS = 128
MAX_MODEL_LENGTH = 100
MAX_TEMPERATURE = 2
# The largest max_completion_tokens passed on (what an integer column holds everywhere).
MAX_COMPLETION_TOKENS = 2**31 - 1
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
FUNCTION_KEYS = ("name", "description", "parameters", "strict")

TURN_ROLE = _("A chat turn starts from a user message or a tool result (role user or tool).")
MODEL_TYPE = _("Must be a non-empty string of at most 100 characters.")
TOOLS_TYPE = _("Must be a non-empty list of at most 128 tools.")
TOOL_TYPE = _('Tool {index}: must be {{"type": "function", "function": {{"name": …}}}}.')
TOOL_NAME = _("Tool {index}: function.name must be 1 to 64 letters, digits, _ or -.")
TOOL_KEYS = _("Tool {index}: unknown keys {keys}.")
TOOL_FIELD = _("Tool {index}: function.{key} has the wrong type.")
TOOL_CHOICE_TYPE = _(
    'Must be "none", "auto", "required" or {"type": "function", "function": {"name": …}}.'
)
TOOL_CHOICE_NO_TOOLS = _("Needs tools.")
UNANSWERED = _(
    "The tool calls {ids} have no result yet: append their results (or send the last one "
    "as the message) first."
)
NOTHING_TO_ANSWER = _("The conversation has no message to answer: send one.")
TEMPERATURE_TYPE = _("Must be a number from 0 to 2.")
MAX_TOKENS_TYPE = _("Must be a positive integer.")


def turn_message_clean(message: Any, *, max_bytes: int) -> dict[str, Any]:
    """The turn's new message, checked; raises MessagesInvalid naming each bad field (one
    entry, for this message) or TooLarge."""
    cleaned = clean_message(message, max_bytes=max_bytes)
    if cleaned["role"] not in TURN_ROLES:
        raise MessagesInvalid([{"role": [str(TURN_ROLE)]}])
    return cleaned


def options_clean(
    *,
    model: Any = None,
    tools: Any = None,
    tool_choice: Any = None,
    temperature: Any = None,
    max_completion_tokens: Any = None,
) -> dict[str, Any]:
    """The options that are set, checked; raises ValidationError naming every bad one."""
    errors: dict[str, list[str]] = {}
    options: dict[str, Any] = {}
    checks = {
        "model": (model, _model_error),
        "tools": (tools, _tools_error),
        "tool_choice": (tool_choice, _tool_choice_error),
        "temperature": (temperature, _temperature_error),
        "max_completion_tokens": (max_completion_tokens, _max_tokens_error),
    }
    for name, (value, check) in checks.items():
        if value is None:
            continue
        problem = unstorable(value) or check(value)
        if problem:
            errors[name] = [problem]
        else:
            options[name] = value
    if tool_choice is not None and tools is None and tool_choice != "none":
        errors.setdefault("tool_choice", [str(TOOL_CHOICE_NO_TOOLS)])
    if errors:
        raise ValidationError(errors)
    return options


def _model_error(value: Any) -> str | None:
    ok = isinstance(value, str) and value.strip() and len(value) <= MAX_MODEL_LENGTH
    return None if ok else str(MODEL_TYPE)


def _tools_error(value: Any) -> str | None:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_TOOLS:
        return str(TOOLS_TYPE)
    for index, tool in enumerate(value):
        problem = _tool_error(index, tool)
        if problem:
            return problem
    return None


def _tool_error(index: int, tool: Any) -> str | None:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        return TOOL_TYPE.format(index=index)
    function = tool.get("function")
    if set(tool) != {"type", "function"} or not isinstance(function, Mapping):
        return TOOL_TYPE.format(index=index)
    unknown = sorted(set(function) - set(FUNCTION_KEYS))
    if unknown:
        keys = ", ".join(field_name(key) for key in unknown)
        return TOOL_KEYS.format(index=index, keys=keys)
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        return TOOL_NAME.format(index=index)
    types = {"description": str, "parameters": Mapping, "strict": bool}
    for key, kind in types.items():
        value = function.get(key)
        if value is not None and not isinstance(value, kind):
            return TOOL_FIELD.format(index=index, key=key)
    return None


def _tool_choice_error(value: Any) -> str | None:
    if isinstance(value, str):
        return None if value in TOOL_CHOICES else str(TOOL_CHOICE_TYPE)
    # A named choice is a valid tool whose function has its name alone.
    named = _tool_error(0, value) is None and set(value["function"]) == {"name"}
    return None if named else str(TOOL_CHOICE_TYPE)


def _temperature_error(value: Any) -> str | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and 0 <= value <= MAX_TEMPERATURE
    return None if ok else str(TEMPERATURE_TYPE)


def _max_tokens_error(value: Any) -> str | None:
    ok = type(value) is int and 0 < value <= MAX_COMPLETION_TOKENS
    return None if ok else str(MAX_TOKENS_TYPE)


def unanswered_calls(messages: list[dict[str, Any]]) -> list[str]:
    """Ids of the tool calls of the newest assistant message that asked for tools which no
    tool message after it answers: a model API refuses a request that leaves any."""
    pending: list[str] = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            pending = [call["id"] for call in message["tool_calls"]]
        elif message.get("role") == "tool" and message.get("tool_call_id") in pending:
            pending.remove(message["tool_call_id"])
        elif pending:
            break  # a later message stands after the round: not this turn's to fix
    return pending


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Tokens as the provider reported them; None where it reported nothing."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    total_tokens: int | None = None

    @classmethod
    def from_provider(cls, usage: Any) -> Usage:
        """From the ``usage`` of a completion or of a stream's last chunk (an object or a
        dict; None or anything malformed reads as nothing reported)."""
        details = _get(usage, "prompt_tokens_details")
        return cls(
            prompt_tokens=_count(_get(usage, "prompt_tokens")),
            completion_tokens=_count(_get(usage, "completion_tokens")),
            cached_tokens=_count(_get(details, "cached_tokens")) if details else None,
            total_tokens=_count(_get(usage, "total_tokens")),
        )


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else getattr(value, key, None)


def _count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 2**31 else None


@dataclass
class ReplyBuilder:
    """A streamed reply, put together chunk by chunk (the chunks as dicts)."""

    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)

    def add(self, chunk: Mapping[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = Usage.from_provider(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # n > 1 is not asked for
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            if isinstance(delta.get("refusal"), str):
                self.refusal.append(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                self._add_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _add_call(self, delta: Mapping[str, Any]) -> None:
        call = self.calls.setdefault(
            delta.get("index", len(self.calls)),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if delta.get("id"):
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def message(self) -> dict[str, Any]:
        """The reply as an assistant message."""
        text, refusal = "".join(self.content), "".join(self.refusal)
        calls = [self.calls[index] for index in sorted(self.calls)]
        # Streams open with an empty content delta: a reply of tool calls (or a refusal)
        # alone has null content, as the same reply does unstreamed.
        content = text if text or not (calls or refusal) else None
        return reply_message(content=content, refusal=refusal or None, tool_calls=calls)


def reply_message(*, content: Any, refusal: Any = None, tool_calls: Any = None) -> dict[str, Any]:
    """An assistant message with only the fields the reply has."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if refusal:
        message["refusal"] = refusal
    return message


def sse(data: Any, *, event: str | None = None) -> bytes:
    """One server-sent event: ``data`` as JSON (or as given when it is a string)."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()
