"""How docs/api.md shows a request and its answer: curl commands, and JSON shortened and
stripped of what changes from run to run, so that the same requests write the same bytes.

Pure functions: no Django, no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

# The widest line a JSON answer or a curl command is folded to.
WIDTH = 96
# Prose is folded to this width.
PROSE_WIDTH = 92
# A longer string is cut at a sentence or word boundary and ends in " …".
STRING_LIMIT = 100
# What marks left-out text, keys or list items; what stands for a time.
ELLIPSIS = "…"
TIME = "<time>"
# Objects whose keys a client chose: PostgreSQL's jsonb answers them in an order of its own,
# so the page shows them sorted.
UNORDERED = frozenset({"metadata"})

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)")
_SENTENCE_END = re.compile(r"[.!?:](?=\s)")


@dataclass(frozen=True)
class Elided:
    """Something left out of an answer: ``{…}``, ``[…]`` or ``…`` (more list items)."""

    mark: str


MORE = Elided(ELLIPSIS)


@dataclass(frozen=True, kw_only=True)
class Shortening:
    """What an answer leaves out. Paths are dotted keys, ``*`` for any list item:
    ``only`` keeps just these keys of their object and marks the rest ``…``, ``hide``
    elides whole values, ``items`` keeps the first N items of a list."""

    only: Collection[str] = ()
    hide: Collection[str] = ()
    items: Mapping[str, int] | None = None
    names: Mapping[str, str] | None = None  # volatile value -> what the document shows
    limit: int | None = STRING_LIMIT  # None: strings whole


def shorten(value: Any, how: Shortening, path: str = "") -> Any:
    """``value`` (parsed JSON) as the document shows it."""
    if path in how.hide:
        return _elided(value)
    if isinstance(value, dict):
        if path.rpartition(".")[2] in UNORDERED:
            value = dict(sorted(value.items()))
        only = {p.rpartition(".")[2] for p in how.only if p.rpartition(".")[0] == path}
        kept = {
            key: shorten(item, how, _join(path, key))
            for key, item in value.items()
            if not only or key in only
        }
        return kept | {ELLIPSIS: MORE} if len(kept) < len(value) else kept
    if isinstance(value, list):
        limit = (how.items or {}).get(path, len(value))
        shown = [shorten(item, how, _join(path, "*")) for item in value[:limit]]
        return [*shown, MORE] if len(value) > limit else shown
    if isinstance(value, str):
        text = stable(value, how.names or {})
        return text if how.limit is None else clip(text, how.limit)
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _elided(value: Any) -> Elided:
    if isinstance(value, dict):
        return Elided("{…}")
    return Elided("[…]" if isinstance(value, list) else ELLIPSIS)


def stable(text: str, names: Mapping[str, str]) -> str:
    """``text`` with ids and times replaced by what does not change from run to run."""
    if _TIMESTAMP.fullmatch(text):
        return TIME
    return _UUID.sub(lambda match: names.get(match.group(), "<id>"), text)


def clip(text: str, limit: int = STRING_LIMIT) -> str:
    """``text`` cut to at most ``limit`` characters: after its first sentence when that is
    long enough to say something, else at the last space."""
    if len(text) <= limit:
        return text
    for match in _SENTENCE_END.finditer(text, 0, limit):
        if match.end() >= 40:
            return f"{text[: match.end()]} {ELLIPSIS}"
    cut = text.rfind(" ", 0, limit)
    return f"{text[: cut if cut > 0 else limit].rstrip()} {ELLIPSIS}"


def flat(value: Any) -> str:
    """``value`` as JSON on one line (``…`` marks included)."""
    if isinstance(value, Elided):
        return value.mark
    if isinstance(value, dict):
        return "{" + ", ".join(_member(key, item) for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(flat(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _member(key: str, item: Any) -> str:
    return ELLIPSIS if item is MORE else f"{flat(key)}: {flat(item)}"


def dump(value: Any, indent: int = 0, used: int = 0) -> str:
    """``value`` as JSON folded to ``WIDTH``: a value that fits stays on one line."""
    one_line = flat(value)
    if used + len(one_line) < WIDTH or not isinstance(value, dict | list) or not value:
        return one_line
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            head = "" if item is MORE else f"{flat(key)}: "
            lines.append(pad + head + dump(item, indent + 2, indent + 2 + len(head)))
        opening, closing = "{", "}"
    else:
        lines = [pad + dump(item, indent + 2, indent + 2) for item in value]
        opening, closing = "[", "]"
    return opening + "\n" + ",\n".join(lines) + "\n" + " " * indent + closing


def curl(method: str, path: str, body: str | None, *, headers: Collection[str] = ()) -> str:
    """The curl command of a request, with the variables of the document's setup block:
    ``$API``, ``${auth[@]}`` and ``${json[@]}``; ``path`` is under ``$API``."""
    url = f"$API{path}"
    options = ["curl", '"${auth[@]}"']
    options += [f'-H "{header}"' for header in headers]
    if body is not None:
        options.append('"${json[@]}"')
    words = ["-X", method] if method != "GET" else []
    words.append(f'"{url}"' if "?" in url else url)
    command = " ".join([*options, *words])
    if len(command) >= WIDTH:
        # Headers of its own: the method and URL go on a line of their own.
        command = " ".join(options) + " \\\n  " + " ".join(words)
    if body is None:
        return command
    data = "-d '" + body.replace("'", "'\\''") + "'"
    last = command.rpartition("\n")[2]
    if "\n" not in body and len(last) + len(data) < WIDTH:
        return f"{command} {data}"
    return f"{command} \\\n  {data}"


def body_text(body: Any) -> str:
    """A request body as the document shows it and as it is sent: folded JSON."""
    return dump(body, indent=2, used=6)


def answer_block(status: int, shown: Any) -> str:
    """The ```json block of an answer; the status line unless it is 200."""
    lines = [] if status == 200 else [f"HTTP {status}"]
    if shown is not None:
        lines.append(dump(shown))
    return "```json\n" + "\n".join(lines) + "\n```"


def table_cell(text: str) -> str:
    """``text`` as code in a Markdown table cell."""
    return "`" + text.replace("|", "\\|") + "`"
