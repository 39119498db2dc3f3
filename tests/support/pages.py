"""The generated pages of docs/ (``make docs``) held to what generates them."""

from __future__ import annotations

import difflib

import pytest

from tests.support.shared import REPO_ROOT


def assert_page_is(page: str, generated: str, source: str) -> None:
    """Fail, with the difference, when the committed ``page`` (a path under the checkout)
    is not ``generated``, what ``source`` says today."""
    committed = (REPO_ROOT / page).read_text(encoding="utf-8")
    if generated != committed:
        diff = difflib.unified_diff(
            committed.splitlines(keepends=True), generated.splitlines(keepends=True), page, source
        )
        pytest.fail(f"{page} is out of date; run make docs.\n" + "".join(diff)[:8000])
