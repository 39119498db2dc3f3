"""The message ctxsum accepts, as one JSON Schema (draft 2020-12, OpenAPI 3.1's dialect): an
OpenAI chat completions message with ctxsum's limits, which ``ctxsum.validation`` checks and
``ctxsum.api.schema`` documents. A ``discriminator`` picks the schema of a message by its
``role`` and of a content part by its ``type``. What no keyword states (unique call ids, no
NUL, sizes, which call a result answers) is checked beside it. Pure: no Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Schema = dict[str, Any]

ROLES = ("system", "developer", "user", "assistant", "tool")
# Provider-reply extras that travel with an assistant message and are returned as given.
EXTRA_FIELDS = ("refusal", "annotations", "audio", "reasoning_content")
FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", *EXTRA_FIELDS)
MAX_ID_LENGTH = 255
MAX_NAME_LENGTH = 100
NULL: Schema = {"type": "null"}


def ref(name: str) -> Schema:
    return {"$ref": f"#/$defs/{name}"}


def string(min_length: int = 0, max_length: int | None = None) -> Schema:
    lengths = {"minLength": min_length, "maxLength": max_length}
    return {"type": "string", **{key: limit for key, limit in lengths.items() if limit}}


def const(value: str) -> Schema:
    """A string that must be ``value``: an enum of one (OpenAPI 3.0 has no const)."""
    return {"type": "string", "enum": [value]}


def nullable(schema: Schema) -> Schema:
    return {**schema, "type": [schema["type"], "null"]}


def closed(properties: Schema, required: Iterable[str] = (), **extra: Any) -> Schema:
    """An object with no keys but ``properties``, as the API refuses any other."""
    schema: Schema = {"type": "object", "properties": properties, "additionalProperties": False}
    return {**schema, **({"required": list(required)} if required else {}), **extra}


def tagged(tag: str, names: dict[str, str]) -> Schema:
    """One of the definitions ``names``: the one its value of ``tag`` names."""
    mapping = {value: ref(name)["$ref"] for value, name in names.items()}
    return {
        "oneOf": [{"$ref": target} for target in mapping.values()],
        "discriminator": {"propertyName": tag, "mapping": mapping},
    }


def part_name(kind: str) -> str:
    """``image_url`` → ``ImageUrlPart``."""
    return "".join(word.title() for word in kind.split("_")) + "Part"


# Each content part's object: text and refusal are strings, the others OpenAI's shapes.
PART_BODIES: dict[str, Schema] = {
    "text": string(),
    "refusal": string(),
    "image_url": closed(
        {
            "url": string(1),
            "detail": nullable({"type": "string", "enum": ["auto", "low", "high", None]}),
        },
        ("url",),
    ),
    "input_audio": closed(
        {"data": string(1), "format": {"type": "string", "enum": ["wav", "mp3"]}},
        ("data", "format"),
    ),
    # file_data or file_id, not blank; filename alone names nothing.
    "file": closed(
        {key: string() for key in ("file_data", "file_id", "filename")},
        anyOf=[
            {"required": [key], "properties": {key: string(1)}} for key in ("file_data", "file_id")
        ],
    ),
}
# The content of messages: its definition, the parts it may hold, and those in words.
CONTENTS = {
    "TextContent": (("text",), "text parts"),
    "UserContent": (
        ("text", "image_url", "input_audio", "file"),
        "text, image, audio and file parts",
    ),
    "AssistantContent": (("text", "refusal"), "text and refusal parts"),
}


def _content(kinds: tuple[str, ...], words: str) -> Schema:
    parts = tagged("type", {kind: part_name(kind) for kind in kinds})
    items = {"type": "array", "minItems": 1, "items": parts}
    return {"description": f"Text, or a non-empty list of {words}.", "oneOf": [string(), items]}


ID = string(1, MAX_ID_LENGTH)
NAME: Schema = {**string(1, MAX_NAME_LENGTH), "description": "The participant's name."}
TOOL_CALLS: Schema = {"type": "array", "minItems": 1, "items": ref("ToolCall")}
EXTRAS: Schema = {
    "refusal": nullable(string()),
    "annotations": nullable({"type": "array", "items": {}}),
    "audio": nullable({"type": "object"}),
    "reasoning_content": nullable(string()),
}
ANSWERED_CALL: Schema = {
    **ID,
    "description": "The id of a tool call of an earlier assistant message of the "
    "conversation that no summary has archived and no result answers yet.",
}
# A reply may leave content out, or send it null, when it called tools, refused or spoke.
REPLY_WITHOUT_CONTENT = {
    "content": ref("AssistantContent"),
    "tool_calls": {"type": "array", "minItems": 1},
    "refusal": string(1),
    "audio": {"type": "object", "minProperties": 1},
}


def _message(role: str, content: str, required: Iterable[str], /, **fields: Schema) -> Schema:
    """A message of ``role``: any role may send tool_calls and tool_call_id as null (SDKs
    dump them so); ``fields`` replace or add to those."""
    base = {"role": const(role), "content": ref(content), "name": NAME}
    return closed({**base, "tool_calls": NULL, "tool_call_id": NULL, **fields}, required)


_ASSISTANT = _message(
    "assistant",
    "AssistantContent",
    ("role",),
    content={"oneOf": [ref("AssistantContent"), NULL]},
    tool_calls=nullable(TOOL_CALLS),
    **EXTRAS,
)
MESSAGES = {
    "system": _message("system", "TextContent", ("role", "content")),
    "developer": _message("developer", "TextContent", ("role", "content")),
    "user": _message("user", "UserContent", ("role", "content")),
    "assistant": {
        **_ASSISTANT,
        "anyOf": [
            {"required": [key], "properties": {key: schema}}
            for key, schema in REPLY_WITHOUT_CONTENT.items()
        ],
    },
    "tool": _message(
        "tool", "TextContent", ("role", "content", "tool_call_id"), tool_call_id=ANSWERED_CALL
    ),
}

DEFINITIONS: dict[str, Schema] = {
    **{
        part_name(kind): closed({"type": const(kind), kind: body}, ("type", kind))
        for kind, body in PART_BODIES.items()
    },
    **{name: _content(*content) for name, content in CONTENTS.items()},
    "ToolCall": closed(
        {
            "id": ID,
            "type": const("function"),
            "function": closed(
                {"name": ID, "arguments": string()},
                ("name", "arguments"),
                description="`arguments` is the JSON text the model wrote, not parsed.",
            ),
        },
        ("id", "type", "function"),
        description="A call's id is unique within its message.",
    ),
    **{f"{role.title()}Message": message for role, message in MESSAGES.items()},
}
MESSAGE: Schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": DEFINITIONS,
    "description": "A message as OpenAI's chat completions API takes it. Any other field is "
    "refused, and so are a NUL character, an unpaired surrogate and a number that is not "
    "finite anywhere in it.",
    **tagged("role", {role: f"{role.title()}Message" for role in ROLES}),
}
