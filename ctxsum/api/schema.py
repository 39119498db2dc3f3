"""The OpenAPI description of the REST API, for drf-spectacular: what no serializer field says.

Messages travel in OpenAI's chat format: the document holds ``ctxsum.message_schema``, the
schema the service validates them with, each of its definitions a component; the
``RawSchema`` components are written out, and the extensions at the end describe the
serializers whose answers are assembled by hand. Read only when a schema is generated, for
the project's ``SPECTACULAR_SETTINGS["OAS_VERSION"]`` (3.0 or 3.1, which spell null apart).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from django.urls.converters import get_converters
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.plumbing import ResolvedComponent, is_jsonschema_compliant
from drf_spectacular.utils import Direction, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.fields import empty

from ctxsum import message_schema
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import FailureCause
from ctxsum.message_schema import NULL, closed, nullable
from ctxsum.policy import UNITS, Reason

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema

Schema = dict[str, Any]
# Names a component (a RawSchema, a plain serializer, or one of the message schema's $defs
# by its name) and adds it to the document.
Ref = Callable[[type[serializers.Serializer[Any]] | str], Schema]

JSON = "application/json"
# The message schema's $defs, each a component of the document.
DEFINITIONS = "#/$defs/"
EVENT_STREAM = "text/event-stream"


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Optional: a key for this request, 1 to 255 visible ASCII characters, "
    "unique per conversation (a UUID will do). A retry with the same key and the same body "
    "is answered with the first success, marked `Idempotent-Replayed: true`, and stores "
    "nothing new; keys are kept for `IDEMPOTENCY_KEY_SECONDS` (a day by default). An error "
    "answer is not kept: a retry runs again. The same key with another body or on another "
    "endpoint, or while the first request still runs, is a 409.",
    pattern="^[!-~]{1,255}$",
)


# --------------------------------------------------------------------------- helpers


def _or_null(schema: Schema) -> Schema:
    """``schema``, or null (spelled as JSON Schema does: see ``_spelled``)."""
    if "type" in schema:
        return nullable(schema)
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return {**schema, key: [*schema[key], NULL]}
    return {"oneOf": [schema, NULL]}


POSITIVE_INTEGER = {"type": "integer", "minimum": 1}


class RawSchema(serializers.Serializer[Any]):
    """A component whose JSON Schema is written out: its ``schema``, or what ``build``
    writes (``ref`` names another component and adds it to the document), as JSON Schema
    spells it (see ``_spelled``). Never used to validate anything."""

    schema: ClassVar[Schema]

    @classmethod
    def build(cls, ref: Ref) -> Schema:
        return cls.schema


# --------------------------------------------------------------------------- messages


def _spelled(schema: Schema, ref: Ref) -> Schema:
    """A schema written as JSON Schema (draft 2020-12) spells it, as the document holds it:
    each of the message schema's $defs a component, and null as the OpenAPI version spells
    it (3.0 has no null type: ``nullable``, or an enum of null wrapped so that
    drf-spectacular's enum hook does not take it for a choice set and drop the null)."""
    if schema.get("$ref", "").startswith(DEFINITIONS):
        return ref(schema["$ref"].removeprefix(DEFINITIONS))
    spelled: Schema = {}
    for key, value in schema.items():
        if key == "properties":
            value = {name: _spelled(item, ref) for name, item in value.items()}
        elif key == "items":
            value = _spelled(value, ref)
        elif key in ("oneOf", "anyOf", "allOf"):
            value = [_spelled(item, ref) for item in value]
        elif key == "discriminator":
            targets = value["mapping"].items()
            mapping = {tag: ref(to.removeprefix(DEFINITIONS))["$ref"] for tag, to in targets}
            value = {**value, "mapping": mapping}
        if not key.startswith("$") or key == "$ref":
            spelled[key] = value
    if is_jsonschema_compliant():
        return spelled
    if spelled == NULL:
        return {"allOf": [{"enum": [None]}]}
    if isinstance(spelled.get("type"), list):
        (kind,) = [name for name in spelled["type"] if name != "null"]
        return {**spelled, "type": kind, "nullable": True}
    return spelled


class ChatMessage(RawSchema):
    """An OpenAI chat completions message: ``ctxsum.message_schema.MESSAGE``, whose ``role``
    picks the schema of its role."""

    schema = message_schema.MESSAGE


class MessageList(RawSchema):
    """The messages of a batch (``{"messages": [...]}``): stored all or none."""

    @classmethod
    def build(cls, ref: Ref) -> Schema:
        return {
            "type": "array",
            "minItems": 1,
            "maxItems": ctxsum_settings.MAX_BATCH_MESSAGES,
            "items": ref(ChatMessage),
        }


class MessagesAppend(RawSchema):
    """One message, or ``{"messages": [...]}``."""

    @classmethod
    def build(cls, ref: Ref) -> Schema:
        batch = closed({"messages": ref(MessageList)}, required=("messages",))
        return {"oneOf": [ref(ChatMessage), batch]}


class SystemPrompt(RawSchema):
    """The leading system (or developer) message's content; null when there is none."""

    schema = _or_null(message_schema.ref("TextContent"))


# --------------------------------------------------------------------------- policy


class Trigger(RawSchema):
    """When to compact; with both keys set, both thresholds must be reached."""

    schema = closed(
        {unit: _or_null(POSITIVE_INTEGER) for unit in UNITS},
        anyOf=[{"required": [unit], "properties": {unit: {"type": "integer"}}} for unit in UNITS],
    )


class Keep(RawSchema):
    """How much recent history stays verbatim: exactly one of ``messages`` or ``tokens``."""

    schema = {
        "oneOf": [
            closed(
                {unit: POSITIVE_INTEGER, **{other: NULL for other in UNITS if other != unit}},
                (unit,),
            )
            for unit in UNITS
        ]
    }


class Policy(RawSchema):
    """The conversation's own overrides; null means the settings' default applies."""

    effective = False

    @classmethod
    def build(cls, ref: Ref) -> Schema:
        trigger, keep = ref(Trigger), ref(Keep)
        return closed(
            {
                "trigger": trigger if cls.effective else _or_null(trigger),
                "keep": keep if cls.effective else _or_null(keep),
                "max_context_tokens": _or_null(POSITIVE_INTEGER),
            },
            required=("trigger", "keep", "max_context_tokens"),
        )


class EffectivePolicy(Policy):
    """The policy in force: the overrides, else the settings' defaults."""

    effective = True


# --------------------------------------------------------------------------- answers


# A conversation's counts; an optional app adds its own keys after these (``stats_keys``).
class ConversationStats(serializers.Serializer[Any]):
    message_count = serializers.IntegerField(min_value=0)
    active_message_count = serializers.IntegerField(min_value=0)
    archived_message_count = serializers.IntegerField(min_value=0)
    active_tokens = serializers.IntegerField(min_value=0)
    summary_count = serializers.IntegerField(min_value=0)
    compaction_count = serializers.IntegerField(min_value=0)
    tokens_saved = serializers.IntegerField(
        min_value=0, help_text="Tokens of the archived messages minus the active summary's."
    )


class Covers(serializers.Serializer[Any]):
    """The messages a summary replaces, cumulative: from the first summarized one."""

    from_seq = serializers.IntegerField(min_value=0)
    to_seq = serializers.IntegerField(min_value=0)


class ArchivedRange(serializers.Serializer[Any]):
    count = serializers.IntegerField(min_value=0)
    from_seq = serializers.IntegerField(min_value=0, allow_null=True)
    to_seq = serializers.IntegerField(min_value=0, allow_null=True)


class CompactionPlan(serializers.Serializer[Any]):
    """What the compaction archives and keeps; ``tokens_after`` counts the summary at its
    length budget."""

    archive = ArchivedRange()
    keep_count = serializers.IntegerField(min_value=0)
    tokens_before = serializers.IntegerField(min_value=0)
    tokens_after = serializers.IntegerField(min_value=0)


FAILURE_REASONS = [Reason.SUMMARIZER_ERROR, Reason.SUMMARY_TRUNCATED]
# What POST .../compact/ answers; an automatic compaction may also answer the others.
COMPACTION_REASONS = [
    reason
    for reason in Reason
    if reason not in (*FAILURE_REASONS, Reason.DEFERRED, Reason.QUEUED, Reason.ERROR)
    and reason not in (Reason.REBUILT, Reason.REVERTED)
]
# What POST .../summaries/rebuild/ answers.
REBUILD_REASONS = [
    Reason.REBUILT,
    Reason.NOTHING_TO_SUMMARIZE,
    Reason.IN_PROGRESS,
    Reason.CONFLICT,
    Reason.NO_GAIN,
]
# What POST .../summaries/{version}/revert/ answers.
REVERT_REASONS = [Reason.REVERTED, Reason.IN_PROGRESS, Reason.CONFLICT]


class Error(serializers.Serializer[Any]):
    """Every error but a 400's field errors: what went wrong, and a stable code."""

    detail = serializers.CharField(help_text="For people.")
    code = serializers.CharField(help_text="For programs: not_found, not_authenticated, …")


class BadGateway(Error):
    """The summarizer failed (``summarizer_error``, with its ``reason`` and ``cause``), or
    for a chat turn the model did (``model_error``); nothing was changed."""

    reason = serializers.ChoiceField(choices=[str(r) for r in FAILURE_REASONS], required=False)
    cause = serializers.ChoiceField(
        choices=[str(cause) for cause in FailureCause],
        required=False,
        help_text="Why the summarizer failed: the provider refused the credentials, could "
        "not be reached, did not answer in time, rate limited, gave an answer that is no "
        "usable summary, answered another error, or another failure.",
    )


class FieldError(serializers.Serializer[Any]):
    """One error of a 400: the field it is about, its code and its words."""

    field = serializers.CharField(
        allow_null=True,
        help_text="The path to the field, dotted (`title`, `policy.trigger`, "
        "`messages.1.role`); null for the request as a whole.",
    )
    code = serializers.CharField(
        help_text="For programs: required, invalid, invalid_choice, null, not_allowed, "
        "unknown_field, max_length, unknown_tool_call, tool_call_answered, …"
    )
    detail = serializers.CharField(help_text="For people.")


class BadRequest(Error):
    """A request the API refuses: ``invalid``, with each field error under ``errors`` (the
    first one in words as ``detail``), or ``parse_error`` for a body that is not JSON."""

    # Named as the body names it: the serializer's own ``errors`` is not used here.
    errors = FieldError(many=True, required=False)  # type: ignore[assignment]


ERRORS: dict[int, tuple[type[serializers.Serializer[Any]], str]] = {
    400: (BadRequest, "The request is invalid; nothing was stored."),
    401: (Error, "No valid credentials."),
    403: (Error, "Not allowed: a session that is not logged in, or without its CSRF token."),
    404: (
        Error,
        "No such conversation (or someone else's), message, summary version, fact, subject "
        "or page.",
    ),
    406: (Error, "None of the Accept header's media types can be served."),
    411: (Error, "A chunked body: send a Content-Length."),
    409: (
        Error,
        "Nothing was run: the Idempotency-Key names another request "
        "(`idempotency_key_reused`), one still running (`idempotency_key_in_progress`), or "
        "one that was applied but never answered (`idempotency_key_answer_lost`); or another "
        "turn of the conversation is in progress (`turn_in_progress`); or a message the model "
        "was sent was redacted during its call (`context_redacted`: the reply is not stored).",
    ),
    413: (Error, "The body, a message or a batch is over its limit."),
    415: (Error, "The body is not JSON."),
    502: (
        BadGateway,
        "The summarizer (or, for a chat turn, the model) failed; nothing was changed.",
    ),
}


def stats_keys(**fields: serializers.Field[Any, Any, Any, Any]) -> None:
    """Add an app's keys, after the core's, to ``ConversationStats`` (the values come from
    its reader, ``ctxsum.hooks.contribute_stats``)."""
    ConversationStats._declared_fields.update(fields)


def error_answer(code: int, answer: type[serializers.Serializer[Any]], description: str) -> None:
    """Declare an app's error answer ``code`` (one ``errors_too`` may then name)."""
    ERRORS[code] = (answer, description)


# Every operation can answer these.
ALWAYS = (401, 403, 404, 406)
# And every one that takes a body these.
BODY = (400, 411, 413, 415)


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """The error answers ``codes``, and those every operation has."""
    return {
        code: OpenApiResponse(response=ERRORS[code][0], description=ERRORS[code][1])
        for code in sorted({*ALWAYS, *codes})
    }


def operation(
    operation_id: str,
    summary: str,
    response: Any,
    *,
    status: int = 200,
    request: Any = empty,
    errors_too: Iterable[int] = (),
    description: str | None = None,
    streamed: Any = None,
) -> Callable[[Any], Any]:
    """``extend_schema`` for one of ctxsum's operations: its answer on success (as JSON, and
    as ``text/event-stream`` described by ``streamed`` when given), the error answers it can
    give (every operation's, a body's for a POST, PUT or PATCH, and ``errors_too``); its
    path's segments described by their converters (``OperationSchema``), its body by the
    view's ``serializer_class`` unless ``request`` names another."""
    success: dict[Any, Any] = {status: response}
    if streamed is not None:
        success = {(status, JSON): response, (status, EVENT_STREAM): streamed}

    def decorate(handler: Any) -> Any:
        body = BODY if handler.__name__ in ("post", "put", "patch") else ()
        declared = extend_schema(
            operation_id=operation_id,
            summary=summary,
            description=description,
            request=request,
            responses={**success, **errors(*body, *errors_too)},
        )(handler).kwargs
        declared["schema"] = type("CtxsumSchema", (OperationSchema, declared["schema"]), {})
        return handler

    return decorate


class OperationSchema:
    """The path's segments as parameters, each described by its converter, a
    ``paths.Segment`` (drf-spectacular cannot tell a segment's form from its converter);
    for an ``idempotent`` operation, the Idempotency-Key header and the 409 answers too."""

    path_regex: str
    idempotent = False
    view: Any

    def get_description(self) -> str:
        # The operation's own words (its description, or its handler's or view's own
        # docstring), never a docstring the view inherits, which says nothing of it.
        described: str = super().get_description()  # type: ignore[misc]
        inherited = {inspect.getdoc(base) for base in type(self.view).__mro__[1:]}
        own = vars(type(self.view)).get("__doc__")
        return "" if not own and described in inherited else described

    def get_override_parameters(self) -> list[Any]:
        converters: dict[str, Any] = get_converters()
        named = [
            OpenApiParameter(
                "id" if name == "pk" else name,
                str,
                OpenApiParameter.PATH,
                description=converters[kind].description,
                pattern=f"^{converters[kind].canonical}$",
            )
            for kind, name in re.findall(r"<(\w+):(\w+)>", self.path_regex)
        ]
        declared = super().get_override_parameters()  # type: ignore[misc]
        return [*named, *declared, *([IDEMPOTENCY_KEY] if self.idempotent else [])]

    def get_response_serializers(self) -> Any:
        declared = super().get_response_serializers()  # type: ignore[misc]
        if not self.idempotent:
            return declared
        # In the order of their status codes (a key is a status, or a status and a media type).
        responses = {**declared, **errors(409)}
        order = sorted(responses, key=lambda key: key if isinstance(key, tuple) else (key, ""))
        return {key: responses[key] for key in order}


def idempotent(handler: Any) -> Any:
    """The ``Idempotency-Key`` header and the 409 answers, added to the operation that
    ``operation`` declared on ``handler`` (see ctxsum.api.idempotency)."""
    declared: Any = getattr(handler, "kwargs", {}).get("schema")
    if not (isinstance(declared, type) and issubclass(declared, OperationSchema)):
        raise TypeError(f"{handler.__qualname__}: put @idempotent above @schema.operation.")
    declared.idempotent = True
    return handler


def page(schema: Schema) -> Schema:
    """DRF's schema of a page of results, with its links' null spelled for the OpenAPI
    version, and every key required: each is in every answer."""
    properties = dict(schema["properties"])
    for link in ("next", "previous"):
        link_schema = {k: v for k, v in properties[link].items() if k != "nullable"}
        properties[link] = _spelled(_or_null(link_schema), _no_definitions)
    return {**schema, "properties": properties, "required": list(properties)}


def _no_definitions(component: Any) -> Schema:
    raise AssertionError(component)


# --------------------------------------------------------------------------- extensions


class RawSchemaExtension(OpenApiSerializerExtension):
    """Gives every ``RawSchema`` the schema its ``build`` writes."""

    target_class = RawSchema
    match_subclasses = True

    def map_serializer(self, auto_schema: AutoSchema, direction: Direction) -> Schema:
        raw: type[RawSchema] = type(self.target)
        ref = _referrer(auto_schema)
        return _spelled(raw.build(ref), ref)


def _referrer(auto_schema: AutoSchema) -> Ref:
    """``ref`` for builders: the component of a RawSchema or of a definition of the message
    schema, shared by requests and answers (no ``Request`` suffix), registered on first use."""

    def ref(component: type[serializers.Serializer[Any]] | str) -> Schema:
        if isinstance(component, str):
            return _definition(auto_schema, component)
        reference: Schema = auto_schema.resolve_serializer(component, "response").ref
        return reference

    return ref


def _definition(auto_schema: AutoSchema, name: str) -> Schema:
    """The component of ``message_schema.DEFINITIONS[name]``, registered on first use."""
    component = ResolvedComponent(name, ResolvedComponent.SCHEMA, object=name)
    if component not in auto_schema.registry:
        auto_schema.registry.register(component)
        component.schema = _spelled(message_schema.DEFINITIONS[name], _referrer(auto_schema))
    reference: Schema = component.ref
    return reference


class StrictSerializerExtension(OpenApiSerializerExtension):
    """An input serializer refuses fields it does not declare: say so."""

    target_class = "ctxsum.api.serializers.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema: AutoSchema, direction: Direction) -> Schema:
        schema: Schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        return {**schema, "additionalProperties": False}


class MessageOutputExtension(OpenApiSerializerExtension):
    """A stored message is its OpenAI fields (only those it has) merged with where it stands
    in the conversation (``seq``, ``archived``, …)."""

    target_class = "ctxsum.api.serializers.MessageOutputSerializer"

    def map_serializer(self, auto_schema: AutoSchema, direction: Direction) -> Schema:
        stored: Schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        # The OpenAI fields: whichever the message's role allows, as it was sent.
        contents = [message_schema.ref(name) for name in message_schema.CONTENTS]
        openai = {
            "role": {"type": "string", "enum": list(message_schema.ROLES)},
            "content": _or_null({"anyOf": contents}),
            "name": message_schema.NAME,
            "tool_calls": message_schema.TOOL_CALLS,
            "tool_call_id": message_schema.ID,
            **message_schema.EXTRAS,
        }
        spelled = _spelled({"properties": openai}, _referrer(auto_schema))["properties"]
        properties = {**spelled, **stored["properties"]}
        required = ["role", "content", *stored.get("required", [])]
        return {
            **stored,
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }


class LeftOutWhenNoneExtension(OpenApiSerializerExtension):
    """An answer that leaves keys out rather than send them as null (``left_out``)."""

    target_class = "ctxsum.api.serializers.LeftOutWhenNone"
    match_subclasses = True

    def map_serializer(self, auto_schema: AutoSchema, direction: Direction) -> Schema:
        schema: Schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        left_out = self.target.left_out
        properties = dict(schema["properties"])
        for key in left_out:
            properties[key] = _bare(properties[key])
        required = [key for key in schema.get("required", []) if key not in left_out]
        return {**schema, "properties": properties, "required": required}


def _bare(schema: Schema) -> Schema:
    """A reference as drf-spectacular wraps it (in ``allOf`` or ``oneOf``, beside null or
    ``readOnly``), bare."""
    wrapped = [item for key in ("allOf", "oneOf") for item in schema.get(key, []) if "$ref" in item]
    return dict(wrapped[0]) if len(wrapped) == 1 else schema
