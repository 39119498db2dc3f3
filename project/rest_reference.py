"""docs/reference/rest-api.md, rendered from the OpenAPI document the example project serves.

``openapi_document()`` builds the document as ``/api/schema/`` serves it (drf-spectacular,
the project's settings); ``render()`` turns any OpenAPI 3.0 or 3.1 document into Markdown:
the security schemes, every operation with its parameters, request body and responses,
grouped by tag, and every component schema, each with an anchor the types link to. The page
is committed; ``manage.py ctxsum_rest_reference`` (``make docs``) writes it, and the test
suite fails when it no longer matches the document.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

Schema = dict[str, Any]

PAGE = "docs/reference/rest-api.md"
METHODS = ("get", "put", "post", "patch", "delete", "head", "options", "trace")
SCHEMA_REF = "#/components/schemas/"
NO_TAG = "Other operations"
# drf-spectacular appends an enum's choices to a field's description as a bullet list
# ("\n\n* `a` - a\n* ..."); the type column already names the values.
ENUM_CHOICES = re.compile(r"(\A|\n\n)\* `[^`]*` - .*\Z", re.DOTALL)

HEADER = """\
# REST API

<!-- Written by `make docs` (manage.py ctxsum_rest_reference) from the OpenAPI document;
edit the API's schema, not this page. -->

"""


def openapi_document() -> Schema:
    """The OpenAPI document ``/api/schema/`` serves, as JSON data."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    document = SchemaGenerator().get_schema(request=None, public=True)
    # Through the renderer the view uses: lazy strings and decimals become plain JSON.
    data: Schema = json.loads(OpenApiJsonRenderer().render(document))
    return data


def generate() -> str:
    return render(openapi_document())


def render(document: Schema) -> str:
    lines = [HEADER.rstrip("\n"), ""]
    lines += _introduction(document)
    lines += _security(document)
    operations = list(_operations(document))
    lines += _operation_index(operations)
    for tag, group in _by_tag(operations):
        lines += [f"## {tag[:1].upper()}{tag[1:]}", ""]
        for path, method, operation in group:
            lines += _operation(path, method, operation)
    schemas = document.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
        for name in sorted(schemas):
            lines += _component(name, schemas[name])
    return "\n".join(lines).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- sections


def _introduction(document: Schema) -> list[str]:
    info = document.get("info", {})
    paths = document.get("paths", {})
    count = sum(1 for _ in _operations(document))
    lines = [
        f"The OpenAPI {document.get('openapi', '')} document of the example project "
        f"({info.get('title', '')} {info.get('version', '')}): {len(paths)} paths, {count} "
        "operations. A project serves the same document at `schema/` beside ctxsum's routes "
        "when it includes `ctxsum.api.schema_urls` (Swagger UI at `docs/`); the paths here "
        "are where the example project mounts them, under `/api/`.",
        "",
        "[REST API by example](../api.md) shows real requests and what they answer.",
        "",
    ]
    if info.get("description"):
        lines[:0] = [_text(info["description"]), ""]
    return lines


def _security(document: Schema) -> list[str]:
    schemes = document.get("components", {}).get("securitySchemes", {})
    if not schemes:
        return []
    lines = [
        "## Authentication",
        "",
        "Every operation takes either of these:",
        "",
        "| scheme | type | sent as | description |",
        "| --- | --- | --- | --- |",
    ]
    for name, scheme in sorted(schemes.items()):
        where = scheme.get("scheme") or (
            f"{scheme.get('in', '')} `{scheme.get('name', '')}`" if scheme.get("name") else ""
        )
        lines.append(
            f"| `{name}` | {scheme.get('type', '')} | {where} | "
            f"{_cell(scheme.get('description', ''))} |"
        )
    return [*lines, ""]


def _operation_index(operations: list[tuple[str, str, Schema]]) -> list[str]:
    lines = ["## Operations", "", "| operation | summary |", "| --- | --- |"]
    for path, method, operation in operations:
        link = f"[`{method.upper()} {path}`](#{_operation_anchor(operation, path, method)})"
        lines.append(f"| {link} | {_cell(operation.get('summary', ''))} |")
    return [*lines, ""]


def _operation(path: str, method: str, operation: Schema) -> list[str]:
    anchor = _operation_anchor(operation, path, method)
    lines = [f"### `{method.upper()} {path}` {{ #{anchor} }}", ""]
    if operation.get("summary"):
        lines += [f"**{_cell(operation['summary'])}**", ""]
    if operation.get("description"):
        lines += [_text(operation["description"]), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += [
            "**Parameters**",
            "",
            "| name | in | type | required | description |",
            "| --- | --- | --- | --- | --- |",
        ]
        for parameter in parameters:
            lines.append(
                f"| `{parameter['name']}` | {parameter.get('in', '')} | "
                f"{type_of(parameter.get('schema', {}))} | "
                f"{'yes' if parameter.get('required') else 'no'} | "
                f"{_cell(parameter.get('description', ''))} |"
            )
        lines.append("")
    body = operation.get("requestBody")
    if body:
        required = "required" if body.get("required") else "optional"
        lines += [f"**Request body** ({required})", ""]
        lines += [f"- {_content(media, content)}" for media, content in _media(body)]
        lines.append("")
    responses = operation.get("responses", {})
    if responses:
        lines += ["**Responses**", "", "| status | body | description |", "| --- | --- | --- |"]
        for status, response in responses.items():
            body_cell = "<br>".join(_content(media, content) for media, content in _media(response))
            lines.append(
                f"| {status} | {body_cell or 'none'} | {_cell(response.get('description', ''))} |"
            )
        lines.append("")
    return lines


def _component(name: str, schema: Schema) -> list[str]:
    lines = [f"### `{name}` {{ #{_schema_anchor(name)} }}", ""]
    description = _without_choices(schema.get("description", ""))
    if description:
        lines += [_text(description), ""]
    properties = schema.get("properties")
    variants = schema.get("oneOf") or schema.get("anyOf")
    if properties is not None:
        required = set(schema.get("required", []))
        lines += [
            "| field | type | required | description |",
            "| --- | --- | --- | --- |",
        ]
        for field, field_schema in properties.items():
            description = _without_choices(field_schema.get("description", ""))
            if field_schema.get("readOnly"):
                description = f"Read-only. {description}".strip()
            lines.append(
                f"| `{field}` | {type_of(field_schema)} | {'yes' if field in required else 'no'} "
                f"| {_cell(description)} |"
            )
        lines.append("")
        lines += _object_rules(schema)
    elif variants and not _only_requirements(variants):
        word = "One" if "oneOf" in schema else "Any"
        lines += [f"{word} of:", ""]
        lines += [f"- {_variant(variant)}" for variant in variants]
        lines.append("")
        lines += _discriminator(schema)
    else:
        lines += [f"Type: {type_of(schema)}.", ""]
    return lines


def _variant(schema: Schema) -> str:
    """A variant of a component: an inline object with its fields, anything else by type."""
    properties = schema.get("properties")
    if schema.get("type") != "object" or not properties:
        return type_of(schema)
    required = set(schema.get("required", []))
    fields = [
        f"`{name}` ({type_of(field)}{', required' if name in required else ''})"
        for name, field in properties.items()
    ]
    closed = "; no other field" if schema.get("additionalProperties") is False else ""
    return f"an object of {', '.join(fields)}{closed}"


def _object_rules(schema: Schema) -> list[str]:
    rules = []
    for key, word in (("anyOf", "at least one"), ("oneOf", "exactly one")):
        variants = schema.get(key)
        if variants and _only_requirements(variants):
            fields = [field for variant in variants for field in variant["required"]]
            rules.append(f"Needs {word} of {_code_list(fields)}.")
    extra = schema.get("additionalProperties")
    if extra is False:
        rules.append("No other field is accepted.")
    elif isinstance(extra, dict):
        rules.append(f"Any other field: {type_of(extra)}.")
    if "minProperties" in schema:
        rules.append(f"At least {schema['minProperties']} field(s).")
    return [" ".join(rules), ""] if rules else []


def _discriminator(schema: Schema) -> list[str]:
    discriminator = schema.get("discriminator")
    if not discriminator:
        return []
    mapping = discriminator.get("mapping", {})
    chosen = ", ".join(f"`{value}`: {_link(ref)}" for value, ref in mapping.items())
    return [f"Chosen by `{discriminator['propertyName']}`: {chosen}.", ""]


# --------------------------------------------------------------------------- types


def type_of(schema: Schema) -> str:
    """A schema as a short Markdown phrase: its type, its values or variants, and its
    constraints; a reference links to the component."""
    if "$ref" in schema:
        return _link(schema["$ref"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    for key in ("oneOf", "anyOf"):
        if key in schema and not _only_requirements(schema[key]):
            return " or ".join(_dedupe(type_of(variant) for variant in schema[key]))
    if "allOf" in schema:
        return " and ".join(type_of(part) for part in schema["allOf"])
    kinds = schema.get("type")
    names = kinds if isinstance(kinds, list) else [kinds] if kinds else []
    words = [_kind(schema, kind) for kind in names if kind != "null"]
    if schema.get("nullable") or "null" in names:
        words.append("null")
    return " or ".join(words) or "any"


def _kind(schema: Schema, kind: str) -> str:
    if kind == "array":
        items = schema.get("items")
        phrase = f"array of {_grouped(type_of(items))}" if items else "array"
        return phrase + _range(schema, "minItems", "maxItems", "items")
    if kind == "object":
        properties = schema.get("properties")
        if properties:
            return f"object ({_code_list(properties)})"
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"object of {_grouped(type_of(extra))}"
        return "object"
    phrase = kind
    if schema.get("format"):
        phrase += f" ({schema['format']})"
    if kind == "string":
        phrase += _range(schema, "minLength", "maxLength", "characters")
        if schema.get("pattern"):
            phrase += f" matching `{schema['pattern']}`"
    else:
        bounds = [
            f"{sign} {schema[key]}"
            for key, sign in (("minimum", "≥"), ("maximum", "≤"))
            if key in schema
        ]
        if bounds:
            phrase += " " + " and ".join(bounds)
    return phrase


def _grouped(phrase: str) -> str:
    """A phrase inside another, in parentheses when it has alternatives of its own."""
    return f"({phrase})" if " or " in phrase else phrase


def _range(schema: Schema, low: str, high: str, unit: str) -> str:
    if low in schema and high in schema:
        return f", {schema[low]} to {schema[high]} {unit}"
    if low in schema:
        return f", at least {schema[low]} {_unit(unit, schema[low])}"
    if high in schema:
        return f", at most {schema[high]} {_unit(unit, schema[high])}"
    return ""


def _unit(unit: str, count: object) -> str:
    return unit.removesuffix("s") if count == 1 else unit


def _only_requirements(variants: list[Schema]) -> bool:
    """Variants that only say which fields are required (``anyOf: [{required: [a]}, ...]``),
    a rule of the object rather than a type."""
    return all(
        "required" in variant
        and "type" not in variant
        and "$ref" not in variant
        for variant in variants
    )


# --------------------------------------------------------------------------- helpers


def _operations(document: Schema) -> Iterable[tuple[str, str, Schema]]:
    for path, item in document.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def _by_tag(
    operations: list[tuple[str, str, Schema]],
) -> list[tuple[str, list[tuple[str, str, Schema]]]]:
    groups: dict[str, list[tuple[str, str, Schema]]] = {}
    for entry in operations:
        tags = entry[2].get("tags") or [NO_TAG]
        groups.setdefault(tags[0], []).append(entry)
    return list(groups.items())


def _media(holder: Schema) -> list[tuple[str, Schema]]:
    return list(holder.get("content", {}).items())


def _content(media: str, content: Schema) -> str:
    schema = content.get("schema")
    return f"`{media}`: {type_of(schema)}" if schema else f"`{media}`"


def _link(ref: str) -> str:
    if not ref.startswith(SCHEMA_REF):
        return f"`{ref}`"
    name = ref.removeprefix(SCHEMA_REF)
    return f"[`{name}`](#{_schema_anchor(name)})"


def _schema_anchor(name: str) -> str:
    return f"schema-{name}"


def _operation_anchor(operation: Schema, path: str, method: str) -> str:
    identifier = operation.get("operationId") or f"{method}-{path}"
    return "operation-" + re.sub(r"[^A-Za-z0-9_-]+", "-", identifier).strip("-")


def _code_list(names: Iterable[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _dedupe(words: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(words))


def _without_choices(text: str) -> str:
    return ENUM_CHOICES.sub("", text).strip()


def _text(text: str) -> str:
    """A description as a paragraph: its own line breaks kept."""
    return text.strip()


def _cell(text: str) -> str:
    """Text for a table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")
