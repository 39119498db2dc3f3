"""What a model API would reject is rejected here: OpenAI chat messages checked against
``ctxsum.message_schema``, with errors that name the field. Pure: no ORM, no I/O.

``schema_failures`` walks the schema for the keywords it uses and says where a value fails
and which keyword failed; the rest words each failure as the API answers it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from ctxsum.exceptions import MessagesInvalid, Problem, TooLarge
from ctxsum.message_schema import DEFINITIONS, FIELDS, MESSAGE, NULL, Schema
from ctxsum.message_schema import EXTRA_FIELDS as EXTRA_FIELDS
from ctxsum.message_schema import MAX_ID_LENGTH as MAX_ID_LENGTH
from ctxsum.message_schema import MAX_NAME_LENGTH as MAX_NAME_LENGTH

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
MESSAGE_TOO_LARGE = _("A message is {size} bytes; the limit is {limit} bytes.")
NUL_CHARACTER = _("Must not contain the NUL character (\\u0000).")
UNPAIRED_SURROGATE = _("Must not contain an unpaired surrogate (\\ud800 to \\udfff).")
NOT_FINITE = _("Must not contain a number that is not finite.")

STRING_OR_NULL = _("Must be a string or null.")
STRING_PART = _("needs a string '{kind}'")
# How a failure is worded: by where it is (its path, with * for an index, else with * for
# its last step) and the keyword that failed ("" for any other; "role" for a field the role
# must not send, which its schema gives as null only or not at all).
WORDING: dict[str, dict[str, Any]] = {
    "content": {
        "required": REQUIRED,
        "null": CONTENT_NULL,
        "minItems": CONTENT_EMPTY_LIST,
        "": CONTENT_TYPE,
    },
    "name": {"": BAD_NAME},
    "tool_calls": {"role": TOOL_CALLS_ROLE, "": TOOL_CALLS_TYPE},
    "tool_call_id": {
        "role": TOOL_CALL_ID_ROLE,
        "required": TOOL_CALL_ID_REQUIRED,
        "": TOOL_CALL_ID_TYPE,
    },
    "refusal": {"role": EXTRA_ROLE, "": STRING_OR_NULL},
    "reasoning_content": {"role": EXTRA_ROLE, "": STRING_OR_NULL},
    "annotations": {"role": EXTRA_ROLE, "": _("Must be a list or null.")},
    "audio": {"role": EXTRA_ROLE, "": _("Must be an object or null.")},
    # A content part's, after "Part {index}: ".
    "content.*": {"type": _("must be an object"), "": _("unknown key(s) {names}")},
    "content.*.type": {"": _("type must be one of: {names}")},
    "content.*.text": {"": STRING_PART},
    "content.*.refusal": {"": STRING_PART},
    "content.*.*": {
        "additionalProperties": _("{kind} has unknown key(s) {names}"),
        "anyOf": _("needs file.file_data or file.file_id"),
        "": _("{kind} must be an object"),
    },
    "content.*.image_url.url": {"": _("needs image_url.url")},
    "content.*.image_url.detail": {"": _("image_url.detail must be auto, low or high")},
    "content.*.input_audio.data": {"": _("needs input_audio.data")},
    "content.*.input_audio.format": {"": _("input_audio.format must be wav or mp3")},
    "content.*.file.*": {"": _("file.{key} must be a string")},
    # A tool call's, after "Call {index}: ".
    "tool_calls.*": {"type": _("must be an object."), "": _("unknown field(s) {names}.")},
    "tool_calls.*.id": {
        "unique": _("id {id!r} is repeated within this message."),
        "": _("id {problem}"),
    },
    "tool_calls.*.type": {"": _("type must be 'function'.")},
    "tool_calls.*.function": {
        "additionalProperties": _("function has unknown field(s) {names}."),
        "": _("function must be an object with name and arguments."),
    },
    "tool_calls.*.function.name": {"": _("function.name must be a non-empty string.")},
    "tool_calls.*.function.arguments": {"": _("function.arguments must be a string.")},
}


class _Unset(Enum):
    UNSET = "unset"


# The default of a keyword a partial update may leave out: None is a value it may be given.
UNSET = _Unset.UNSET
Unset = Literal[_Unset.UNSET]


def unstorable(value: Any) -> str | None:
    """What keeps a JSON value out of the database, or None: a NUL character or an unpaired
    surrogate in a string or key (PostgreSQL refuses both), or a number that is not finite
    (``1e400`` parses as infinity)."""
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


# --------------------------------------------------------------------------- the schema

Path = tuple[str | int, ...]
JSON_TYPES: dict[str, Any] = {
    "string": lambda value: isinstance(value, str),
    "array": lambda value: isinstance(value, list),
    "object": lambda value: isinstance(value, Mapping),
    "null": lambda value: value is None,
}
# dict first: what JSON parses to, found without asking the Mapping ABC.
DICT_TYPES = (dict, Mapping)
# The same, as the Python types a value may have.
PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "array": (list,),
    "object": DICT_TYPES,
    "null": (type(None),),
}
# Each keyword's test, for the type of value it applies to.
LIMITS: dict[str, tuple[type, Any]] = {
    "minLength": (str, lambda value, limit: len(value) >= limit),
    "maxLength": (str, lambda value, limit: len(value) <= limit),
    "minItems": (list, lambda value, limit: len(value) >= limit),
    "minProperties": (Mapping, lambda value, limit: len(value) >= limit),
}


@dataclass(frozen=True)
class Failure:
    """Where a value fails its schema (the path from the message to it), the keyword that
    failed, and what it found (the unknown keys, the values a discriminator takes)."""

    path: Path
    keyword: str
    found: Any = None


def _resolve(schema: Schema) -> Schema:
    while "$ref" in schema:
        schema = DEFINITIONS[schema["$ref"].removeprefix("#/$defs/")]
    return schema


def _accepts(schema: Schema, value: Any) -> bool:
    """Whether ``value`` has a type ``schema`` (or one of its alternatives) allows."""
    schema = _resolve(schema)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return any(JSON_TYPES[name](value) for name in types)
    return "oneOf" not in schema or any(_accepts(branch, value) for branch in schema["oneOf"])


def schema_failures(schema: Schema, value: Any, path: Path = ()) -> Iterator[Failure]:
    """Every failure of ``value`` against ``schema``: a node's first failing keyword of
    type, enum and the limits, then each key or item. ``oneOf`` without a type picks by type."""
    schema = _resolve(schema)
    if "discriminator" in schema:
        yield from _tagged_failures(schema, value, path)
    elif "oneOf" in schema and "type" not in schema:
        chosen = [branch for branch in schema["oneOf"] if _accepts(branch, value)]
        if not chosen:
            yield Failure(path, "type")
        else:
            yield from schema_failures(chosen[0], value, path)
    elif not _accepts(schema, value):
        yield Failure(path, "type")
    elif "enum" in schema and value not in schema["enum"]:
        yield Failure(path, "enum")
    elif failed := [
        keyword
        for keyword, (kind, holds) in LIMITS.items()
        if keyword in schema and isinstance(value, kind) and not holds(value, schema[keyword])
    ]:
        yield Failure(path, failed[0])
    elif isinstance(value, Mapping):
        yield from _object_failures(schema, value, path)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from schema_failures(schema["items"], item, (*path, index))


def _tagged_failures(schema: Schema, value: Any, path: Path) -> Iterator[Failure]:
    """One of the schemas the discriminator maps to, picked by the value of its property."""
    if not isinstance(value, Mapping):
        yield Failure(path, "type")
        return
    tag, mapping = schema["discriminator"]["propertyName"], schema["discriminator"]["mapping"]
    chosen = value.get(tag)
    if not (isinstance(chosen, str) and chosen in mapping):
        yield Failure((*path, tag), "discriminator", list(mapping))
    else:
        yield from schema_failures({"$ref": mapping[chosen]}, value, path)


def _object_failures(schema: Schema, value: Mapping[str, Any], path: Path) -> Iterator[Failure]:
    properties: Schema = schema.get("properties", {})
    if schema.get("additionalProperties") is False and (
        unknown := sorted(set(value) - set(properties))
    ):
        yield Failure(path, "additionalProperties", unknown)
    branches = schema.get("anyOf", ())
    if branches and all(any(schema_failures(branch, value, path)) for branch in branches):
        yield Failure(path, "anyOf", [branch["required"][0] for branch in branches])
    for key, subschema in properties.items():
        if key in value:
            yield from schema_failures(subschema, value[key], (*path, key))
        elif key in schema.get("required", ()):
            yield Failure((*path, key), "required")


Check = Callable[[Any], bool]


def _kinds(schema: Schema) -> tuple[type, ...]:
    """The Python types of the values ``_accepts`` takes: the schema's, its branches', any."""
    schema = _resolve(schema)
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return tuple(kind for name in names for kind in PYTHON_TYPES[name])
    branches = schema.get("oneOf", ())
    return tuple(kind for branch in branches for kind in _kinds(branch)) or (object,)


def _passes(schema: Schema) -> Check:
    """A test of whether ``schema_failures`` finds nothing in a value, built once per schema:
    its keywords read and its references followed ahead, no path or failure built. The
    quick answer for the usual, valid message; the walk says what failed."""
    schema = _resolve(schema)
    if "discriminator" in schema:
        tag, mapping = schema["discriminator"]["propertyName"], schema["discriminator"]["mapping"]
        by_tag = {value: _passes({"$ref": ref}) for value, ref in mapping.items()}

        def tagged(value: Any) -> bool:
            chosen = value.get(tag) if isinstance(value, DICT_TYPES) else None
            return isinstance(chosen, str) and chosen in by_tag and by_tag[chosen](value)

        return tagged
    if "oneOf" in schema and "type" not in schema:
        branches = [(_kinds(branch), _passes(branch)) for branch in schema["oneOf"]]

        def one_of(value: Any) -> bool:  # the first branch the value's type fits decides
            for kinds, ok in branches:
                if isinstance(value, kinds):
                    return ok(value)
            return False

        return one_of
    return _node_passes(schema)


def _node_passes(schema: Schema) -> Check:
    kinds, enum = _kinds(schema), schema.get("enum")
    limits = [(*LIMITS[keyword], schema[keyword]) for keyword in LIMITS if keyword in schema]
    properties = [(key, _passes(sub)) for key, sub in schema.get("properties", {}).items()]
    required, names = set(schema.get("required", ())), set(schema.get("properties", {}))
    closed = schema.get("additionalProperties") is False
    any_of = [_passes(branch) for branch in schema.get("anyOf", ())]
    items = _passes(schema["items"]) if "items" in schema else None
    keyed = closed or bool(properties or any_of)  # whether an object's keys are checked

    def passes(value: Any) -> bool:
        if not isinstance(value, kinds) or (enum is not None and value not in enum):
            return False
        if limits and any(
            isinstance(value, kind) and not holds(value, limit) for kind, holds, limit in limits
        ):
            return False
        if keyed and isinstance(value, DICT_TYPES):
            if (closed and not names.issuperset(value)) or (
                any_of and not any(ok(value) for ok in any_of)
            ):
                return False
            for key, ok in properties:
                if not (ok(value[key]) if key in value else key not in required):
                    return False
            return True
        return items is None or not isinstance(value, list) or all(map(items, value))

    return passes


MESSAGE_PASSES = _passes(MESSAGE)


def _worded(failure: Failure) -> str:
    """A failure as the API words it."""
    steps = ["*" if isinstance(step, int) else step for step in failure.path]
    words = WORDING.get(".".join(steps)) or WORDING[".".join([*steps[:-1], "*"])]
    found = ", ".join(failure.found) if isinstance(failure.found, list) else failure.found
    return str(words.get(failure.keyword, words[""])).format(
        names=found,
        id=found,
        kind=failure.path[2] if len(failure.path) > 2 else "",
        key=failure.path[-1],
        problem=str(TOOL_CALL_ID_TYPE).lower(),
    )


# The code of a field's failure, by the keyword that failed ("role": a field the message's
# role must not send); any other is "invalid".
CODES = {"required": "required", "null": "null", "role": "not_allowed"}


def _problem(failure: Failure) -> Problem:
    """A failure of one field as the API words it, with its code."""
    return Problem(_worded(failure), CODES.get(failure.keyword, "invalid"))


def _repeated_ids(calls: list[Any], failures: list[Failure]) -> list[Failure]:
    """A failure for each tool call whose (valid) id an earlier call of the message has:
    what no JSON Schema keyword says."""
    bad = {failure.path[1] for failure in failures if failure.path[2:3] == ("id",)}
    seen: set[str] = set()
    repeated = []
    for index, call in enumerate(calls):
        if not isinstance(call, Mapping) or "id" not in call or index in bad:
            continue
        if call["id"] in seen:
            repeated.append(Failure(("tool_calls", index, "id"), "unique", call["id"]))
        seen.add(call["id"])
    return repeated


def _part_errors(failures: list[Failure]) -> list[str]:
    """The first error of each content part that has one."""
    first = {failure.path[1]: failure for failure in reversed(failures)}
    return [
        str(_("Part {index}: {error}.")).format(index=index, error=_worded(first[index]))
        for index in sorted(first)
    ]


def _call_errors(failures: list[Failure]) -> list[str]:
    """Every error of each tool call, in the order of the call's fields."""
    order = list(DEFINITIONS["ToolCall"]["properties"])

    def position(failure: Failure) -> tuple[Any, int]:
        return failure.path[1], order.index(failure.path[2]) if failure.path[2:] else -1

    return [
        str(_("Call {index}: {error}")).format(index=failure.path[1], error=_worded(failure))
        for failure in sorted(failures, key=position)
    ]


def _message_errors(message: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every error of a message, by field, in the order of FIELDS (unknown ones first)."""
    calls = message.get("tool_calls")  # once the schema passes: None or valid calls
    if MESSAGE_PASSES(message) and (not calls or len({call["id"] for call in calls}) == len(calls)):
        return {}  # the usual message, found valid (no unknown field: closed schemas)
    unknown = [field_name(field) for field in sorted(set(message) - set(FIELDS))]
    errors: dict[str, list[str]] = {
        key: [Problem(UNKNOWN_FIELD, "unknown_field")] for key in unknown
    }
    role = message.get("role")
    failures = list(schema_failures(MESSAGE, message))
    if failures and failures[0].path == ("role",):
        if role is None:
            return {**errors, "role": [Problem(REQUIRED, "required")]}
        return {**errors, "role": [Problem(BAD_ROLE, "invalid_choice")]}
    allowed = _resolve({"$ref": MESSAGE["discriminator"]["mapping"][role]})["properties"]
    nested: dict[str, list[Failure]] = {}
    for failure in failures:
        field, keyword = str(failure.path[0]) if failure.path else "", failure.keyword
        if len(failure.path) > 1:
            nested.setdefault(field, []).append(failure)
        elif field:
            if allowed[field] == NULL:
                keyword = "role"
            elif keyword == "type" and message[field] is None:
                keyword = "null"
            errors[field] = [_problem(Failure(failure.path, keyword))]
        elif keyword == "additionalProperties":
            extras = [key for key in failure.found if key in FIELDS]
            errors |= {key: [_problem(Failure((key,), "role"))] for key in extras}
        elif not any(message.get(key) for key in failure.found):
            # A reply with none of content, tool_calls, refusal or audio (a field sent with
            # a value of the wrong type has its own error).
            missing = "null" if "content" in message else "required"
            errors.setdefault("content", [_problem(Failure(("content",), missing))])
    if "tool_calls" not in errors and isinstance(calls := message.get("tool_calls"), list):
        inner = nested.get("tool_calls", [])
        nested["tool_calls"] = [*inner, *_repeated_ids(calls, inner)]
    if nested.get("content"):
        errors["content"] = _part_errors(nested["content"])
    if nested.get("tool_calls"):
        errors["tool_calls"] = _call_errors(nested["tool_calls"])
    return {field: errors[field] for field in [*unknown, *FIELDS] if field in errors}


def clean_message(message: Any, *, max_bytes: int) -> dict[str, Any]:
    """Check one OpenAI chat message and return it normalized (only the fields it has).
    Raises MessagesInvalid naming each bad field, or TooLarge over ``max_bytes``."""
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
    if errors := _message_errors(message):
        raise MessagesInvalid([errors])
    cleaned: dict[str, Any] = {"role": message["role"], "content": message.get("content")}
    for field in ("name", "tool_calls", "tool_call_id", *EXTRA_FIELDS):
        if message.get(field) is not None or (field in EXTRA_FIELDS and field in message):
            cleaned[field] = message[field]
    return cleaned
