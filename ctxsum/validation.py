"""What a model API would reject is rejected here: OpenAI chat messages checked field by
field, with errors that name the field. Pure: no ORM, no I/O."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal, TypeGuard

from django.utils.text import format_lazy
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ctxsum.exceptions import MessagesInvalid, TooLarge

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
MAX_ID_LENGTH = 255
MAX_NAME_LENGTH = 100

NOT_AN_OBJECT = _("Expected a JSON object.")
NOT_A_STRING = _("Must be a string.")
REQUIRED = _("This field is required.")
UNKNOWN_FIELD = _("Unknown field.")
BAD_ROLE = _("Must be one of: system, developer, user, assistant, tool.")
CONTENT_TYPE = _("Must be a string or a list of content parts.")
CONTENT_NULL = _(
    "Can be null only on an assistant message that has tool_calls, a refusal or audio."
)
CONTENT_EMPTY_LIST = _("A list of content parts must not be empty.")
BAD_NAME = format_lazy(
    _("Must be a non-empty string of at most {limit} characters."), limit=MAX_NAME_LENGTH
)
TOOL_CALLS_ROLE = _("Only assistant messages can have tool_calls.")
TOOL_CALLS_TYPE = _("Must be a non-empty list of tool calls.")
TOOL_CALL_ID_REQUIRED = _("A tool message needs the tool_call_id of the call it answers.")
TOOL_CALL_ID_ROLE = _("Only tool messages can have a tool_call_id.")
TOOL_CALL_ID_TYPE = format_lazy(
    _("Must be a non-empty string of at most {limit} characters."), limit=MAX_ID_LENGTH
)
TOOL_CALL_ID_UNKNOWN = _(
    "No earlier assistant message in this conversation has a tool call with id {id!r}."
)
TOOL_CALL_ID_ARCHIVED = _(
    "The tool call with id {id!r} has been summarized; a result for it can no longer join the "
    "context."
)
TOOL_CALL_ID_ANSWERED = _("The tool call with id {id!r} has its result already.")
EXTRA_ROLE = _("Only assistant messages can have this field.")
# The JSON type each extra must have when it is not null.
EXTRA_TYPES: dict[str, tuple[type, Any]] = {
    "refusal": (str, _("Must be a string or null.")),
    "reasoning_content": (str, _("Must be a string or null.")),
    "annotations": (list, _("Must be a list or null.")),
    "audio": (Mapping, _("Must be an object or null.")),
}
MESSAGE_TOO_LARGE = _("A message is {size} bytes; the limit is {limit} bytes.")
NUL_CHARACTER = _("Must not contain the NUL character (\\u0000).")
UNPAIRED_SURROGATE = _("Must not contain an unpaired surrogate (\\ud800 to \\udfff).")
NOT_FINITE = _("Must not contain a number that is not finite.")


class _Unset(Enum):
    UNSET = "unset"


# The default of a keyword a partial update may leave out: None is a value it may be given.
UNSET = _Unset.UNSET
Unset = Literal[_Unset.UNSET]


def unstorable(value: Any) -> str | None:
    """What keeps a JSON value out of the database, or None: a NUL character or an unpaired
    surrogate in a string or key (PostgreSQL's text and jsonb refuse both, and neither is
    valid UTF-8 text), or a number that is not finite (JSON has none; ``1e400`` parses as
    infinity)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return str(NUL_CHARACTER)
            if not item.isascii() and _has_surrogate(item):
                return str(UNPAIRED_SURROGATE)
        elif isinstance(item, float) and not math.isfinite(item):
            return str(NOT_FINITE)
        elif isinstance(item, Mapping):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return None


def field_name(key: Any) -> str:
    """A client's key as an error may name it: an unpaired surrogate, which no JSON answer
    can carry, shown escaped."""
    return str(key).encode("utf-8", "backslashreplace").decode()


def _has_surrogate(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _is_text(value: Any, max_length: int | None = None) -> TypeGuard[str]:
    if not isinstance(value, str) or not value:
        return False
    return max_length is None or len(value) <= max_length


def _image_error(body: Mapping[str, Any]) -> str | None:
    if not _is_text(body.get("url")):
        return gettext("needs image_url.url")
    if body.get("detail") not in (None, "auto", "low", "high"):
        return gettext("image_url.detail must be auto, low or high")
    return None


def _audio_error(body: Mapping[str, Any]) -> str | None:
    if not _is_text(body.get("data")):
        return gettext("needs input_audio.data")
    if body.get("format") not in AUDIO_FORMATS:
        return gettext("input_audio.format must be wav or mp3")
    return None


def _file_error(body: Mapping[str, Any]) -> str | None:
    if not (_is_text(body.get("file_data")) or _is_text(body.get("file_id"))):
        return gettext("needs file.file_data or file.file_id")
    wrong = [key for key in PART_BODIES["file"] if key in body and not isinstance(body[key], str)]
    if wrong:
        return gettext("file.{key} must be a string").format(key=wrong[0])
    return None


# The keys each non-text part's object may have (OpenAI's shapes), and its check.
PART_BODIES = {
    "image_url": ("url", "detail"),
    "input_audio": ("data", "format"),
    "file": ("file_data", "file_id", "filename"),
}
_BODY_ERRORS = {"image_url": _image_error, "input_audio": _audio_error, "file": _file_error}


def _part_error(part: Any, allowed: tuple[str, ...]) -> str | None:
    if not isinstance(part, Mapping):
        return gettext("must be an object")
    kind = part.get("type")
    if kind not in allowed:
        return gettext("type must be one of: {types}").format(types=", ".join(allowed))
    if unknown := sorted(set(part) - {"type", kind}):
        return gettext("unknown key(s) {names}").format(names=", ".join(unknown))
    body = part.get(kind)
    if kind in ("text", "refusal"):
        return (
            None if isinstance(body, str) else gettext("needs a string '{kind}'").format(kind=kind)
        )
    if not isinstance(body, Mapping):
        return gettext("{kind} must be an object").format(kind=kind)
    if unknown := sorted(set(body) - set(PART_BODIES[kind])):
        return gettext("{kind} has unknown key(s) {names}").format(
            kind=kind, names=", ".join(unknown)
        )
    return _BODY_ERRORS[kind](body)


def _content_errors(message: Mapping[str, Any], role: str) -> list[str]:
    content = message.get("content")
    if content is None:
        # A reply that called tools, refused, or spoke has no content, and can be sent back so.
        if role == "assistant" and (
            message.get("tool_calls") or message.get("refusal") or message.get("audio")
        ):
            return []
        return [str(REQUIRED if "content" not in message else CONTENT_NULL)]
    if isinstance(content, str):
        return []
    if not isinstance(content, list):
        return [str(CONTENT_TYPE)]
    if not content:
        return [str(CONTENT_EMPTY_LIST)]
    allowed = PART_TYPES.get(role, ("text",))
    return [
        gettext("Part {index}: {error}.").format(index=index, error=error)
        for index, part in enumerate(content)
        if (error := _part_error(part, allowed))
    ]


def _function_errors(function: Any) -> list[str]:
    if not isinstance(function, Mapping):
        return [gettext("function must be an object with name and arguments.")]
    errors = []
    unknown = sorted(set(function) - {"name", "arguments"})
    if unknown:
        errors.append(
            gettext("function has unknown field(s) {names}.").format(names=", ".join(unknown))
        )
    if not _is_text(function.get("name"), MAX_ID_LENGTH):
        errors.append(gettext("function.name must be a non-empty string."))
    if not isinstance(function.get("arguments"), str):
        errors.append(gettext("function.arguments must be a string."))
    return errors


def _call_errors(call: Any, seen: set[str]) -> list[str]:
    """What is wrong with one tool call; ``seen`` holds the ids of the message's earlier
    calls, and gains this one's."""
    if not isinstance(call, Mapping):
        return [gettext("must be an object.")]
    errors = []
    unknown = sorted(set(call) - {"id", "type", "function"})
    if unknown:
        errors.append(gettext("unknown field(s) {names}.").format(names=", ".join(unknown)))
    call_id = call.get("id")
    if not _is_text(call_id, MAX_ID_LENGTH):
        errors.append(gettext("id {problem}").format(problem=str(TOOL_CALL_ID_TYPE).lower()))
    elif call_id in seen:
        errors.append(gettext("id {id!r} is repeated within this message.").format(id=call_id))
    else:
        seen.add(call_id)
    if call.get("type") != "function":
        errors.append(gettext("type must be 'function'."))
    return errors + _function_errors(call.get("function"))


def _tool_call_errors(tool_calls: Any) -> list[str]:
    if not isinstance(tool_calls, list) or not tool_calls:
        return [str(TOOL_CALLS_TYPE)]
    seen: set[str] = set()
    return [
        gettext("Call {index}: {error}").format(index=index, error=error)
        for index, call in enumerate(tool_calls)
        for error in _call_errors(call, seen)
    ]


def _field_errors(message: Mapping[str, Any], role: str) -> dict[str, list[str]]:
    """Every bad field but unknown ones of a message whose role is valid."""
    errors: dict[str, list[str]] = {}
    if content_errors := _content_errors(message, role):
        errors["content"] = content_errors
    if "name" in message and not _is_text(message["name"], MAX_NAME_LENGTH):
        errors["name"] = [str(BAD_NAME)]
    if message.get("tool_calls") is not None:
        if role != "assistant":
            errors["tool_calls"] = [str(TOOL_CALLS_ROLE)]
        elif call_errors := _tool_call_errors(message["tool_calls"]):
            errors["tool_calls"] = call_errors
    if role == "tool":
        if "tool_call_id" not in message:
            errors["tool_call_id"] = [str(TOOL_CALL_ID_REQUIRED)]
        elif not _is_text(message["tool_call_id"], MAX_ID_LENGTH):
            errors["tool_call_id"] = [str(TOOL_CALL_ID_TYPE)]
    elif message.get("tool_call_id") is not None:
        errors["tool_call_id"] = [str(TOOL_CALL_ID_ROLE)]
    for field in EXTRA_FIELDS:
        if field not in message:
            continue
        kind, type_error = EXTRA_TYPES[field]
        if role != "assistant":
            errors[field] = [str(EXTRA_ROLE)]
        elif message[field] is not None and not isinstance(message[field], kind):
            errors[field] = [str(type_error)]
    return errors


def clean_message(message: Any, *, max_bytes: int) -> dict[str, Any]:
    """Check one OpenAI chat message and return it normalized (only the fields it has).

    Raises MessagesInvalid (with this message's errors as its only entry) naming each bad
    field, or TooLarge when its JSON is over ``max_bytes``.
    """
    if not isinstance(message, Mapping):
        raise MessagesInvalid([{"non_field_errors": [str(NOT_AN_OBJECT)]}])
    problems = {
        field_name(field): [problem]
        for field, value in message.items()
        if (problem := unstorable(field) or unstorable(value))
    }
    if problems:
        raise MessagesInvalid([problems])
    size = len(json.dumps(message, ensure_ascii=False).encode())
    if size > max_bytes:
        raise TooLarge(MESSAGE_TOO_LARGE.format(size=size, limit=max_bytes))
    unknown = sorted(set(message) - set(FIELDS))
    errors = {field_name(field): [str(UNKNOWN_FIELD)] for field in unknown}
    role = message.get("role")
    if role not in ROLES:
        errors["role"] = [str(REQUIRED if role is None else BAD_ROLE)]
    else:
        errors.update(_field_errors(message, role))
    if errors:
        raise MessagesInvalid([errors])
    cleaned: dict[str, Any] = {"role": role, "content": message.get("content")}
    for field in ("name", "tool_calls", "tool_call_id", *EXTRA_FIELDS):
        if message.get(field) is not None or (field in EXTRA_FIELDS and field in message):
            cleaned[field] = message[field]
    return cleaned
