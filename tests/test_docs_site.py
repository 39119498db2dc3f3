"""The documentation site's reference pages say what the code does: docs/reference/settings.md
documents every key of CTXSUM with its real default and type, and no key that does not
exist; docs/reference/rest-api.md is what the OpenAPI document says today; and
docs/reference/python-api.md names every public name of the modules it covers."""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest
from django.utils.module_loading import import_string

from ctxsum.chat.conf import ChatDefaults
from ctxsum.conf import Defaults
from project.rest_reference import PAGE, generate, render
from tests.support.pages import assert_page_is
from tests.support.shared import REPO_ROOT

SETTINGS_MD = REPO_ROOT / "docs" / "reference" / "settings.md"
PYTHON_API_MD = REPO_ROOT / "docs" / "reference" / "python-api.md"
# A key of CTXSUM as the page names it: in code, as a heading or a table row's first cell.
KEY_HEADING = re.compile(r"^#{2,6} `([A-Z][A-Z0-9_]*)`\s*$", re.MULTILINE)
KEY_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \|", re.MULTILINE)
CHECK_ROW = re.compile(r"^\| `(ctxsum\.[EW]\d{3})` \|", re.MULTILINE)
CHECK_ID = re.compile(r"ctxsum\.[EW]\d{3}")

# Defaults, not ctxsum.conf.DEFAULTS: the test settings change two of its values.
DEFAULT_CLASSES: tuple[type, ...] = (Defaults, ChatDefaults)


def setting_keys() -> dict[str, tuple[Any, str]]:
    """Every key of CTXSUM: its default and its annotated type."""
    return {
        name: (getattr(cls, name), annotation)
        for cls in DEFAULT_CLASSES
        for name, annotation in cls.__annotations__.items()
    }


def documented_keys(text: str) -> list[str]:
    return KEY_HEADING.findall(text) + KEY_ROW.findall(text)


def sections(text: str) -> dict[str, str]:
    """Each key's heading and the text under it, up to the next heading."""
    parts = re.split(r"^(#{2,6} .*)$", text, flags=re.MULTILINE)
    found = {}
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        match = KEY_HEADING.match(heading)
        if match:
            found[match.group(1)] = body
    return found


def field(body: str, name: str) -> str:
    """The code of a key's ``- Name: `code``` line."""
    match = re.search(rf"^- {name}: `([^`]+)`", body, flags=re.MULTILINE)
    assert match, f"no {name!r} line"
    return match.group(1)


def default_of(code: str) -> Any:
    """A default as the page writes it: a Python literal, or the dotted path of a constant."""
    try:
        return ast.literal_eval(code)
    except (ValueError, SyntaxError):
        return import_string(code)


@pytest.fixture(scope="module")
def settings_page() -> str:
    return SETTINGS_MD.read_text(encoding="utf-8")


def test_every_setting_is_documented_and_nothing_else(settings_page):
    documented = documented_keys(settings_page)
    keys = setting_keys()
    assert sorted(set(keys) - set(documented)) == [], "settings missing from the page"
    assert sorted(set(documented) - set(keys)) == [], "the page names keys that do not exist"
    assert len(documented) == len(set(documented)), "a key documented twice"


@pytest.mark.parametrize("key", sorted(setting_keys()))
def test_a_settings_default_and_type_are_the_codes(settings_page, key):
    default, annotation = setting_keys()[key]
    body = sections(settings_page)[key]
    assert default_of(field(body, "Default")) == default
    assert field(body, "Type") == annotation


def test_the_system_checks_table_lists_every_check_the_code_reports(settings_page):
    in_code = {
        check_id
        for path in (REPO_ROOT / "ctxsum").rglob("*.py")
        for check_id in CHECK_ID.findall(path.read_text(encoding="utf-8"))
    }
    assert sorted(CHECK_ROW.findall(settings_page)) == sorted(in_code)
    # and every check a key's section names is one the code reports
    assert set(CHECK_ID.findall(settings_page)) <= in_code


def test_the_parsers_find_what_they_look_for():
    page = '## Part\n\n### `TRIGGER`\n\n- Default: `{"tokens": 1}`\n- Type: `int`\n\n'
    page += "| `KEEP` | x |\n"
    assert documented_keys(page) == ["TRIGGER", "KEEP"]
    assert default_of(field(sections(page)["TRIGGER"], "Default")) == {"tokens": 1}
    assert default_of("ctxsum.conf.DEFAULT_PROMPT").startswith("You compress")


# --------------------------------------------------------------------------- REST API


def test_docs_reference_rest_api_md_is_what_the_openapi_document_says():
    assert_page_is(PAGE, generate(), "what the OpenAPI document says")


def test_the_rest_reference_renders_operations_parameters_bodies_and_schemas():
    document = {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "paths": {
            "/things/{id}/": {
                "post": {
                    "operationId": "things_touch",
                    "summary": "Touch a thing",
                    "tags": ["things"],
                    "parameters": [
                        {"in": "path", "name": "id", "required": True, "schema": {"type": "string"}}
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/In"}}
                        },
                    },
                    "responses": {"204": {"description": "Touched | done."}},
                }
            }
        },
        "components": {
            "schemas": {
                "In": {
                    "type": "object",
                    "properties": {
                        "count": {"type": ["integer", "null"], "minimum": 1},
                        "kind": {"$ref": "#/components/schemas/KindEnum"},
                    },
                    "required": ["kind"],
                    "additionalProperties": False,
                },
                "KindEnum": {"enum": ["a", "b"], "description": "* `a` - a\n* `b` - b"},
            }
        },
    }
    page = render(document)
    assert "[`POST /things/{id}/`](#operation-things_touch)" in page
    assert "### `POST /things/{id}/` { #operation-things_touch }" in page
    assert "| `id` | path | string | yes |  |" in page
    assert "**Request body** (required)" in page
    assert "- `application/json`: [`In`](#schema-In)" in page
    assert "| 204 | none | Touched \\| done. |" in page
    assert "| `count` | integer ≥ 1 or null | no |  |" in page
    assert "| `kind` | [`KindEnum`](#schema-KindEnum) | yes |  |" in page
    assert "No other field is accepted." in page
    assert 'Type: one of `"a"`, `"b"`.' in page
    assert "* `a`" not in page


# --------------------------------------------------------------------------- Python API

# The modules whose ``__all__`` the page documents; of ctxsum.services, its first list (the
# API for your code; the second is what the faces use besides).
PUBLIC_MODULES = (
    "ctxsum/services/__init__.py",
    "ctxsum/selectors.py",
    "ctxsum/summarizers/__init__.py",
    "ctxsum/chat/services.py",
    "ctxsum/integrations/openai_agents.py",
    "ctxsum/integrations/langchain.py",
)
# The modules the page renders whole.
WHOLE_MODULES = ("ctxsum.hooks", "ctxsum.signals", "ctxsum.exceptions")
DIRECTIVE = re.compile(r"^::: (\S+)", re.MULTILINE)
MEMBER = re.compile(r"^ {8}- (\w+)$", re.MULTILINE)


def first_all(path: str) -> list[str]:
    """The names of a module's first ``__all__ = [...]``, read without importing it."""
    tree = ast.parse((REPO_ROOT / path).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            names = ast.literal_eval(node.value)
            assert isinstance(names, list)
            return names
    raise AssertionError(f"{path} has no __all__")


def python_api_blocks(text: str) -> dict[str, list[str]]:
    """Each ``::: object`` of the page and the members its options list."""
    blocks = {}
    starts = list(DIRECTIVE.finditer(text))
    for match, following in zip(starts, [*starts[1:], None], strict=True):
        end = following.start() if following else len(text)
        blocks[match.group(1)] = MEMBER.findall(text[match.end() : end])
    return blocks


@pytest.mark.parametrize("path", PUBLIC_MODULES)
def test_the_python_api_page_documents_every_public_name(path):
    module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    blocks = python_api_blocks(PYTHON_API_MD.read_text(encoding="utf-8"))
    # a name is documented as a member a block lists, or as an object rendered by its path
    documented = {member for members in blocks.values() for member in members}
    documented |= {name.rsplit(".", 1)[-1] for name in blocks}
    assert module in blocks
    assert sorted(set(first_all(path)) - documented) == []


def test_the_python_api_page_renders_the_whole_modules():
    blocks = python_api_blocks(PYTHON_API_MD.read_text(encoding="utf-8"))
    for module in WHOLE_MODULES:
        assert blocks.get(module) == [], f"{module} is not rendered whole"
