"""The OpenAPI document at /api/schema/: a valid OpenAPI 3 document (3.1 as the example
project serves it, and 3.0 for projects that keep drf-spectacular's default) that describes
every URL and method of the API, whose message component takes the messages the API takes
and refuses those it refuses, and whose answers are the ones the API gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.urls import URLPattern, get_resolver, reverse
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.settings import patched_settings
from openapi_schema_validator import OAS30Validator, OAS31Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4, DRAFT202012

from ctxsum.api import urls as api_urls
from ctxsum.api.errors import unanswered

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).parent / "fixtures" / "conversations.jsonl"
DOCUMENT = "urn:ctxsum:openapi"
PLACEHOLDER = "00000000-0000-4000-8000-000000000000"
SEQ_PLACEHOLDER = "98765"
VERSION_PLACEHOLDER = "87654"
FACT_PLACEHOLDER = "76543"
SUBJECT_PLACEHOLDER = "subject-placeholder"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def served(client) -> dict[str, Any]:
    response = client.get(reverse("schema"), HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200, response.content
    return json.loads(response.content)


def validator(document: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A validator of ``schema``, whose $refs point into ``document``, with the dialect of
    the document's OpenAPI version."""
    version_31 = document["openapi"].startswith("3.1")
    specification = DRAFT202012 if version_31 else DRAFT4
    resource = Resource.from_contents(document, default_specification=specification)
    registry: Registry = Registry().with_resource(DOCUMENT, resource)
    cls = OAS31Validator if version_31 else OAS30Validator
    return cls(_rebased(schema), registry=registry)


def _rebased(schema: Any) -> Any:
    """``schema`` with its document-local $refs made absolute."""
    if isinstance(schema, dict):
        return {
            key: f"{DOCUMENT}{value}" if key == "$ref" else _rebased(value)
            for key, value in schema.items()
        }
    if isinstance(schema, list):
        return [_rebased(item) for item in schema]
    return schema


def component(document: dict[str, Any], name: str) -> Any:
    return validator(document, {"$ref": f"#/components/schemas/{name}"})


def answer_schema(document: dict[str, Any], path: str, method: str, status: int) -> Any:
    content = document["paths"][path][method]["responses"][str(status)]["content"]
    return validator(document, content["application/json"]["schema"])


def assert_valid(checker: Any, instance: Any) -> None:
    errors = [f"{error.json_path}: {error.message}" for error in checker.iter_errors(instance)]
    assert not errors, (instance, errors[:3])


# --------------------------------------------------------------------------- the document


def test_the_served_schema_is_a_valid_openapi_31_document(api):
    served_document = served(api)
    assert served_document["openapi"] == "3.1.0"
    validate(served_document)


def test_the_schema_is_valid_openapi_30_too():
    """drf-spectacular's default version, which a project that installs ctxsum may keep."""
    with patched_settings({"OAS_VERSION": "3.0.3"}):
        document_30 = SchemaGenerator().get_schema(request=None, public=True)
    assert document_30["openapi"] == "3.0.3"
    validate(document_30)
    # Null as 3.0 spells it: no "null" type, no list of types.
    text = json.dumps(document_30)
    assert '"type": "null"' not in text and '"type": [' not in text


def api_operations() -> set[tuple[str, str]]:
    """(path as the schema writes it, method) for every URL and method of ctxsum.api."""
    operations = set()
    for pattern in get_resolver(api_urls).url_patterns:
        assert isinstance(pattern, URLPattern)
        if pattern.callback is unanswered:  # the last route: a JSON 404, no operation
            continue
        converters = pattern.pattern.converters
        kwargs = {"pk": PLACEHOLDER} if "pk" in converters else {}
        kwargs |= {"seq": SEQ_PLACEHOLDER} if "seq" in converters else {}
        kwargs |= {"version": VERSION_PLACEHOLDER} if "version" in converters else {}
        kwargs |= {"fact_id": FACT_PLACEHOLDER} if "fact_id" in converters else {}
        kwargs |= {"subject": SUBJECT_PLACEHOLDER} if "subject" in converters else {}
        path = reverse(f"ctxsum:{pattern.name}", kwargs=kwargs)
        path = path.replace(PLACEHOLDER, "{id}").replace(SEQ_PLACEHOLDER, "{seq}")
        path = path.replace(VERSION_PLACEHOLDER, "{version}")
        path = path.replace(FACT_PLACEHOLDER, "{fact_id}")
        path = path.replace(SUBJECT_PLACEHOLDER, "{subject}")
        view = pattern.callback.view_class  # type: ignore[attr-defined]
        for method in view.http_method_names:
            if method not in ("options", "head") and hasattr(view, method):
                operations.add((path, method))
    return operations


def test_every_url_and_method_of_the_api_is_described(document):
    described = {
        (path, method)
        for path, item in document["paths"].items()
        for method in item
        if path.startswith(reverse("ctxsum:api-root"))
    }
    expected = api_operations()
    assert len(expected) == 25
    assert described == expected


def test_every_operation_names_its_answers_and_errors(document):
    ids = []
    for (path, method), operation in (
        ((path, method), operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ):
        ids.append(operation["operationId"])
        codes = set(operation["responses"])
        assert {"401", "403", "404", "406"} <= codes, (path, method)
        assert any(code.startswith("2") for code in codes), (path, method)
        if "requestBody" in operation:
            assert {"400", "411", "413", "415"} <= codes, (path, method)
            assert list(operation["requestBody"]["content"]) == ["application/json"]
        in_path = {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "path"}
        named = ("id", "seq", "version", "fact_id", "subject")
        assert set(in_path) == {name for name in named if f"{{{name}}}" in path}, (path, method)
        if "{id}" in path:
            assert in_path["id"]["schema"]["pattern"].startswith("^[0-9a-f]{8}-")
        if "{fact_id}" in path:
            assert in_path["fact_id"]["schema"]["pattern"] == "^[1-9][0-9]{0,18}$"
    assert len(ids) == len(set(ids)), "operationIds are unique"
    compact = document["paths"]["/api/conversations/{id}/compact/"]["post"]["responses"]
    assert "502" in compact


def test_bad_gateway_and_errors_have_their_codes(document):
    bad_gateway = component(document, "BadGateway")
    failed = {"detail": "The summarizer failed.", "code": "summarizer_error"}
    assert_valid(bad_gateway, {**failed, "reason": "summary_truncated"})
    assert not bad_gateway.is_valid({**failed, "reason": "other"})
    bad_request = component(document, "BadRequest")
    invalid = {"detail": "title: Must be a string.", "code": "invalid"}
    for body in (
        {**invalid, "errors": [{"field": "title", "code": "invalid", "detail": "…"}]},
        {**invalid, "errors": [{"field": None, "code": "invalid", "detail": "…"}]},
        {"detail": "JSON parse error", "code": "parse_error"},
    ):
        assert_valid(bad_request, body)
    # Field errors without a code, as DRF shapes them, are not what the API answers.
    assert not bad_request.is_valid({"title": ["Must be a string."]})
    assert not bad_request.is_valid({**invalid, "errors": [{"field": "title", "detail": "…"}]})


# --------------------------------------------------------------------------- messages


def fixture_conversations() -> list[dict[str, Any]]:
    with FIXTURES.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def test_the_message_component_takes_the_real_messages_the_api_takes(api, document):
    chat_message = component(document, "ChatMessage")
    url = reverse("ctxsum:conversation-list")
    taken = 0
    for record in fixture_conversations():
        response = api.post(url, {"messages": record["messages"]}, format="json")
        if response.status_code != 201:
            continue  # the API refuses it (a reused tool call id): nothing to compare
        taken += 1
        for message in record["messages"]:
            assert_valid(chat_message, message)
    assert taken >= 8


def call(call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


# Messages that use what the real data does not: parts, extras, names, nulls.
TAKEN = [
    {"role": "developer", "content": [{"type": "text", "text": "Be brief."}], "name": "ops"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            {"type": "file", "file": {"file_id": "file-1", "filename": "a.pdf"}},
        ],
        "tool_calls": None,
    },
    {"role": "assistant", "tool_calls": [call("call_9")], "refusal": None, "annotations": []},
    {"role": "tool", "tool_call_id": "call_9", "content": [{"type": "text", "text": "42"}]},
    {"role": "assistant", "content": None, "refusal": "I can't help with that."},
    {"role": "assistant", "content": None, "audio": {"id": "audio_1"}},
    {
        "role": "assistant",
        "content": [{"type": "text", "text": "Hi"}, {"type": "refusal", "refusal": "no"}],
        "reasoning_content": "The user greets.",
        "tool_call_id": None,
    },
]

REFUSED = [
    {"role": "user", "content": "hi", "refusal": "no"},
    {"role": "user", "content": None},
    {"role": "assistant"},
    {"role": "assistant", "content": None, "refusal": ""},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": []},
    {"role": "user", "content": [{"type": "refusal", "refusal": "x"}]},
    {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]},
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]},
    {"role": "user", "content": "hi", "foo": 1},
    {"role": "user", "content": "hi", "name": ""},
    {"role": "user", "content": "hi", "tool_calls": [call()]},
    {"role": "assistant", "content": None, "tool_calls": []},
    {"role": "assistant", "content": None, "tool_calls": [{**call(), "type": "other"}]},
    {"role": "critic", "content": "hi"},
]


@pytest.fixture
def conversation_url(api) -> str:
    response = api.post(reverse("ctxsum:conversation-list"), {}, format="json")
    return reverse("ctxsum:message-list", kwargs={"pk": response.json()["id"]})


def test_the_message_component_takes_every_form_the_api_takes(api, document, conversation_url):
    chat_message = component(document, "ChatMessage")
    for message in TAKEN:
        response = api.post(conversation_url, message, format="json")
        assert response.status_code == 201, (message, response.json())
        assert_valid(chat_message, message)


def test_the_message_component_refuses_what_the_api_refuses(api, document, conversation_url):
    chat_message = component(document, "ChatMessage")
    for message in REFUSED:
        response = api.post(conversation_url, message, format="json")
        assert response.status_code == 400, (message, response.json())
        assert not chat_message.is_valid(message), message


def test_a_post_takes_one_message_or_a_batch(document):
    body = component(document, "MessagesAppendRequest")
    assert_valid(body, {"role": "user", "content": "hi"})
    assert_valid(body, {"messages": [{"role": "user", "content": "hi"}]})
    assert not body.is_valid({"messages": []})
    assert not body.is_valid({"messages": [{"role": "user", "content": "hi"}], "extra": 1})


# --------------------------------------------------------------------------- answers


def test_the_answers_are_as_the_schema_describes_them(api, document):
    """A conversation with parts, tool calls, a compaction and a summary, read back through
    every GET, each answer validated against its operation's 200 schema."""
    policy = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
    messages = [{"role": "system", "content": "Be brief."}, *TAKEN[1:4]]
    messages += [{"role": "user", "content": f"Turn {n}"} for n in range(4)]
    created = api.post(
        reverse("ctxsum:conversation-list"),
        {"title": "Parts", "policy": policy, "messages": messages},
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert_valid(answer_schema(document, "/api/conversations/", "post", 201), created.json())
    pk = created.json()["id"]
    compact = reverse("ctxsum:compact", kwargs={"pk": pk})
    compacted = api.post(compact, {"force": True}, format="json")
    assert compacted.json()["compacted"], compacted.json()
    path = "/api/conversations/{id}/"
    assert_valid(answer_schema(document, f"{path}compact/", "post", 200), compacted.json())
    for name, suffix in [
        ("conversation-detail", ""),
        ("message-list", "messages/"),
        ("context", "context/"),
        ("summary-list", "summaries/"),
    ]:
        response = api.get(reverse(f"ctxsum:{name}", kwargs={"pk": pk}))
        assert_valid(answer_schema(document, path + suffix, "get", 200), response.json())
    listed = api.get(reverse("ctxsum:conversation-list"))
    assert_valid(answer_schema(document, "/api/conversations/", "get", 200), listed.json())
    redacted = api.post(reverse("ctxsum:message-redact", kwargs={"pk": pk, "seq": 1}))
    assert redacted.status_code == 200, redacted.json()
    assert_valid(
        answer_schema(document, f"{path}messages/{{seq}}/redact/", "post", 200), redacted.json()
    )
    rebuilt = api.post(reverse("ctxsum:summary-rebuild", kwargs={"pk": pk}))
    assert rebuilt.json()["rebuilt"], rebuilt.json()
    assert_valid(answer_schema(document, f"{path}summaries/rebuild/", "post", 200), rebuilt.json())
    reverted = api.post(reverse("ctxsum:summary-revert", kwargs={"pk": pk, "version": 2}))
    assert reverted.json()["reverted"], reverted.json()
    assert_valid(
        answer_schema(document, f"{path}summaries/{{version}}/revert/", "post", 200),
        reverted.json(),
    )


def test_the_schema_refuses_an_answer_that_is_not_one(document):
    """The answers' schemas are closed where the API's answers are: a stored message with a
    field no message has fails."""
    message = {
        "role": "user",
        "content": "hi",
        "seq": 0,
        "token_count": 5,
        "archived": False,
        "summary_version": None,
        "replaced": False,
        "created_at": "2026-01-01T00:00:00Z",
    }
    stored = component(document, "MessageOutput")
    assert_valid(stored, message)
    assert not stored.is_valid({**message, "surprise": 1})
    assert not stored.is_valid({key: value for key, value in message.items() if key != "seq"})
