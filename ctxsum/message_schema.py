"""The message ctxsum accepts, as one JSON Schema: an OpenAI chat completions message with
ctxsum's limits. ``ctxsum.validation`` checks every message against it, and
``ctxsum.api.schema`` puts it in the OpenAPI document; nothing else describes a message.

``MESSAGE`` is draft 2020-12 (the dialect of OpenAPI 3.1), self-contained: its parts are
named in ``$defs`` (the document's components). Each role has a message schema of its own,
picked by the ``discriminator`` on ``role`` (OpenAPI's keyword, which validation follows),
and each content part by the one on ``type``. A field another role has is given on a role
that must not send it as null only (SDKs dump them so) or not at all.

What a schema cannot state is checked beside it: a tool call's id is unique within its
message (``ctxsum.validation``); no string holds a NUL character or an unpaired surrogate
and no number is infinite; a message's size, a batch's length (settings) and which calls a
tool result may answer (the database). Pure: no Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Schema = dict[str, Any]

ROLES = ("system", "developer", "user", "assistant", "tool")
# Provider-reply extras that travel with an assistant message and are returned as given.
EXTRA_FIELDS = ("refusal", "annotations", "audio", "reasoning_content")
FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", *EXTRA_FIELDS)
# Which content parts each role may carry, as the chat completions API accepts them.
PART_TYPES = {
    "system": ("text",),
    "developer": ("text",),
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
    "tool": ("text",),
}
AUDIO_FORMATS = ("wav", "mp3")
IMAGE_DETAILS = ("auto", "low", "high")
MAX_ID_LENGTH = 255
MAX_NAME_LENGTH = 100

NULL: Schema = {"type": "null"}


def ref(name: str) -> Schema:
    return {"$ref": f"#/$defs/{name}"}


def string(min_length: int = 0, max_length: int | None = None) -> Schema:
    schema: Schema = {"type": "string"}
    if min_length:
        schema["minLength"] = min_length
    if max_length is not None:
        schema["maxLength"] = max_length
    return schema


def const(value: str) -> Schema:
    """A string that must be ``value`` (an enum of one: OpenAPI 3.0 has no const)."""
    return {"type": "string", "enum": [value]}


def nullable(schema: Schema) -> Schema:
    return {**schema, "type": [schema["type"], "null"]}


def closed(properties: Schema, required: Iterable[str] = (), **extra: Any) -> Schema:
    """An object with no keys but ``properties``, as the API refuses any other."""
    schema: Schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return {**schema, **extra}


def one_of_tagged(tag: str, names: dict[str, str]) -> Schema:
    """One of the components ``names`` (by value of ``tag``), picked by its ``tag``."""
    refs = {value: ref(name) for value, name in names.items()}
    return {
        "oneOf": list(refs.values()),
        "discriminator": {
            "propertyName": tag,
            "mapping": {value: target["$ref"] for value, target in refs.items()},
        },
    }


def part_name(kind: str) -> str:
    """``image_url`` → ``ImageUrlPart``."""
    return "".join(word.title() for word in kind.split("_")) + "Part"


# --------------------------------------------------------------------------- parts

FILE_KEYS = ("file_data", "file_id", "filename")
# The object of each part: text and refusal are strings, the others OpenAI's shapes.
PART_BODIES: dict[str, Schema] = {
    "text": string(),
    "refusal": string(),
    "image_url": closed(
        {"url": string(1), "detail": nullable({"type": "string", "enum": [*IMAGE_DETAILS, None]})},
        ("url",),
    ),
    "input_audio": closed(
        {"data": string(1), "format": {"type": "string", "enum": list(AUDIO_FORMATS)}},
        ("data", "format"),
    ),
    # file_data or file_id, not blank; filename alone names nothing.
    "file": closed(
        {key: string() for key in FILE_KEYS},
        anyOf=[{"required": [key], "properties": {key: string(1)}} for key in FILE_KEYS[:2]],
    ),
}
PARTS = {
    part_name(kind): closed({"type": const(kind), kind: body}, ("type", kind))
    for kind, body in PART_BODIES.items()
}

# The content each role sends: its component, and the parts it may hold.
CONTENTS = {
    "TextContent": ("system", "text parts"),
    "UserContent": ("user", "text, image, audio and file parts"),
    "AssistantContent": ("assistant", "text and refusal parts"),
}


def _content(role: str, words: str) -> Schema:
    parts = one_of_tagged("type", {kind: part_name(kind) for kind in PART_TYPES[role]})
    return {
        "description": f"Text, or a non-empty list of {words}.",
        "oneOf": [string(), {"type": "array", "minItems": 1, "items": parts}],
    }


# --------------------------------------------------------------------------- messages

ID = string(1, MAX_ID_LENGTH)
NAME: Schema = {**string(1, MAX_NAME_LENGTH), "description": "The participant's name."}
TOOL_CALL = closed(
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
)
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


def _message(role: str, content: Schema, **fields: Schema) -> Schema:
    """A message of ``role``: tool_calls and tool_call_id may be null on any role, and
    ``fields`` replace or add to those."""
    properties = {
        "role": const(role),
        "content": content,
        "name": NAME,
        "tool_calls": NULL,
        "tool_call_id": NULL,
        **fields,
    }
    return closed(properties, ("role", "content"))


# A reply may leave content out, or send it null, when it called tools, refused or spoke.
REPLY_WITHOUT_CONTENT = {
    "content": ref("AssistantContent"),
    "tool_calls": {"type": "array", "minItems": 1},
    "refusal": string(1),
    "audio": {"type": "object", "minProperties": 1},
}
_ASSISTANT = _message(
    "assistant",
    {"oneOf": [ref("AssistantContent"), NULL]},
    tool_calls=nullable(TOOL_CALLS),
    **EXTRAS,
)
_TOOL = _message("tool", ref("TextContent"), tool_call_id=ANSWERED_CALL)

MESSAGES = {
    "system": _message("system", ref("TextContent")),
    "developer": _message("developer", ref("TextContent")),
    "user": _message("user", ref("UserContent")),
    "assistant": {
        **_ASSISTANT,
        "required": ["role"],
        "anyOf": [
            {"required": [key], "properties": {key: schema}}
            for key, schema in REPLY_WITHOUT_CONTENT.items()
        ],
    },
    "tool": {**_TOOL, "required": [*_TOOL["required"], "tool_call_id"]},
}

DEFINITIONS: dict[str, Schema] = {
    **PARTS,
    **{name: _content(role, words) for name, (role, words) in CONTENTS.items()},
    "ToolCall": TOOL_CALL,
    **{f"{role.title()}Message": message for role, message in MESSAGES.items()},
}

MESSAGE: Schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": DEFINITIONS,
    "description": "A message as OpenAI's chat completions API takes it. Any other field is "
    "refused, and so are a NUL character, an unpaired surrogate and a number that is not "
    "finite anywhere in it.",
    **one_of_tagged("role", {role: f"{role.title()}Message" for role in ROLES}),
}
