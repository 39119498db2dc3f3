"""README.md is the landing page: short, and every relative link in it names a file of the
repository (GitHub shows a link to a missing file as a 404)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.shared import REPO_ROOT

README = REPO_ROOT / "README.md"
MAX_LINES = 250

# [text](target) and ![alt](target), the target up to its first space or closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")


def relative_links(markdown: str) -> list[str]:
    """The targets of the Markdown links and images of ``markdown`` that name a file of the
    repository: no scheme, no bare anchor; the anchor and query left out."""
    targets = []
    for target in LINK.findall(markdown):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0].split("?", 1)[0])
    return targets


def missing(markdown: str, root: Path) -> list[str]:
    return [target for target in relative_links(markdown) if not (root / target).exists()]


def test_the_readme_is_at_most_250_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; at most {MAX_LINES}"


def test_every_relative_link_of_the_readme_names_a_file():
    text = README.read_text(encoding="utf-8")
    links = relative_links(text)
    # The landing page leads into the documentation and shows a picture.
    assert "docs/quickstart.md" in links
    assert any(link.startswith("docs/images/") for link in links)
    assert missing(text, REPO_ROOT) == []


def test_a_link_to_a_missing_file_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("", encoding="utf-8")
    text = (
        "[here](docs/here.md#a-section) [gone](docs/gone.md) ![picture](docs/images/x.png)\n"
        "[site](https://example.org/docs/gone.md) [anchor](#license) <http://127.0.0.1:8000>"
    )
    assert relative_links(text) == ["docs/here.md", "docs/gone.md", "docs/images/x.png"]
    assert missing(text, tmp_path) == ["docs/gone.md", "docs/images/x.png"]
