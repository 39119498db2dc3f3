"""A 400's field errors as the tests read them: by the dotted path of their field."""

from __future__ import annotations

from typing import Any


def _errors(answer: Any) -> list[dict[str, Any]]:
    body = answer if isinstance(answer, dict) else answer.json()
    assert body.get("code") == "invalid", body
    assert isinstance(body.get("errors"), list) and body["errors"], body
    return body["errors"]


def field_errors(answer: Any) -> dict[str, list[str]]:
    """The words of each field error of ``answer`` (a response or its JSON body), by field:
    ``{"messages.1.role": ["…"]}``; ``""`` for the request as a whole."""
    found: dict[str, list[str]] = {}
    for error in _errors(answer):
        found.setdefault(error["field"] or "", []).append(error["detail"])
    return found


def field_codes(answer: Any) -> dict[str, list[str]]:
    """The codes of each field error of ``answer``, by field, as ``field_errors``."""
    found: dict[str, list[str]] = {}
    for error in _errors(answer):
        found.setdefault(error["field"] or "", []).append(error["code"])
    return found
