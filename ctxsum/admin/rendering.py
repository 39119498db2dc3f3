"""Messages and summaries as the review pages show them: plain text the templates escape,
never markup. Pure: no ORM queries, no I/O."""

from __future__ import annotations

import difflib
import itertools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.translation import gettext

from ctxsum.conf import ctxsum_settings
from ctxsum.models import Message, Summary
from ctxsum.selectors import prompt_sha256

# Longer texts are cut on the review pages; the message's own admin page shows all of it.
MAX_CHARS = 20_000
_WORDS = re.compile(r"\s+|[^\s]+")
_MEDIA = {"image_url": "[image]", "input_audio": "[audio]"}


@dataclass(frozen=True, kw_only=True)
class Block:
    """One piece of a message's content: ``text``, ``media`` (a placeholder) or
    ``refusal``; ``omitted`` characters were cut off."""

    kind: str
    text: str
    omitted: int = 0


@dataclass(frozen=True, kw_only=True)
class ToolCallView:
    id: str
    name: str
    arguments: Block  # pretty-printed when it is JSON


@dataclass(frozen=True, kw_only=True)
class MessageView:
    """A message ready for the chat template."""

    message: Message
    blocks: list[Block]
    tool_calls: list[ToolCallView] = field(default_factory=list)
    tool_name: str = ""  # for a tool result: the function of the call it answers
    extras: list[tuple[str, Block]] = field(default_factory=list)
    newly_archived: bool = False  # on a summary's page: archived by that version


def cut(text: str, kind: str = "text") -> Block:
    """``text`` as a block, cut at MAX_CHARS."""
    return Block(kind=kind, text=text[:MAX_CHARS], omitted=max(len(text) - MAX_CHARS, 0))


def pretty_json(value: Any) -> str:
    """A JSON object or array (or its text) indented; any other text as it is."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if not isinstance(parsed, dict | list):
            return value
        value = parsed
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _part(part: object) -> Block:
    if not isinstance(part, Mapping):
        return Block(kind="media", text="[unknown]")
    kind = part.get("type")
    if kind in ("text", "refusal"):
        return cut(str(part.get(kind) or ""), kind)
    if kind == "file":
        filename = (part.get("file") or {}).get("filename")
        return Block(kind="media", text=f"[file {filename}]" if filename else "[file]")
    if isinstance(kind, str) and kind:
        return Block(kind="media", text=_MEDIA.get(kind, f"[{kind}]"))
    return Block(kind="media", text="[unknown]")


def content_blocks(message: Message) -> list[Block]:
    """The content as blocks; a tool result that is JSON comes pretty-printed."""
    content = message.content
    if content is None:
        return []
    if isinstance(content, str):
        return [cut(pretty_json(content) if message.role == "tool" else content)]
    if isinstance(content, list):
        return [_part(part) for part in content]
    return [cut(pretty_json(content))]


def _tool_calls(message: Message) -> list[ToolCallView]:
    # Stored tool calls were validated: each is {"id", "type", "function": {"name", ...}}.
    functions = [(call, call.get("function") or {}) for call in message.tool_calls or ()]
    return [
        ToolCallView(
            id=str(call.get("id", "")),
            name=str(function.get("name", "")),
            arguments=cut(pretty_json(function.get("arguments") or "")),
        )
        for call, function in functions
    ]


def message_views(
    messages: Iterable[Message], *, archived_by: Summary | None = None
) -> list[MessageView]:
    """Views of ``messages`` (in seq order); a tool result names the function of the
    nearest earlier call with its id among them. With ``archived_by``, the messages that
    summary archived are marked."""
    calls: dict[str, str] = {}
    views = []
    for message in messages:
        tool_calls = _tool_calls(message)
        calls.update((call.id, call.name) for call in tool_calls)
        views.append(
            MessageView(
                message=message,
                blocks=content_blocks(message),
                tool_calls=tool_calls,
                tool_name=calls.get(message.tool_call_id, "") if message.tool_call_id else "",
                extras=[(key, cut(pretty_json(value))) for key, value in message.extra.items()],
                newly_archived=archived_by is not None and message.summary_id == archived_by.pk,
            )
        )
    return views


def word_diff(old: str, new: str) -> list[tuple[str, str]]:
    """(kind, text) runs turning ``old`` into ``new`` word by word; kind is ``same``,
    ``removed`` or ``added``. Plain text: the template escapes it."""
    before, after = _WORDS.findall(old), _WORDS.findall(new)
    runs: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            runs.append(("same", "".join(before[i1:i2])))
            continue
        if i2 > i1:
            runs.append(("removed", "".join(before[i1:i2])))
        if j2 > j1:
            runs.append(("added", "".join(after[j1:j2])))
    return runs


def stale_reasons(summary: Summary) -> list[str]:
    """Why ``summary`` is stale (see selectors.summary_is_stale); empty when current."""
    reasons = []
    if summary.prompt_version != ctxsum_settings.PROMPT_VERSION:
        reasons.append(
            gettext("written under prompt version %(old)s; the current one is %(new)s")
            % {"old": summary.prompt_version, "new": ctxsum_settings.PROMPT_VERSION}
        )
    if summary.prompt_sha256 != prompt_sha256(ctxsum_settings.PROMPT):
        reasons.append(gettext("the prompt's text has changed since (its SHA-256 differs)"))
    if summary.covers_redacted:
        reasons.append(gettext("a message it covers was redacted since"))
    return reasons


@dataclass(frozen=True, kw_only=True)
class Group:
    """Consecutive transcript messages that share a state: ``archived`` under ``summary``,
    ``active`` (in the context), or ``replaced`` (a retired system prompt)."""

    kind: str
    summary: Summary | None
    messages: list[MessageView]


def _state(view: MessageView) -> tuple[str, Summary | None]:
    message = view.message
    if message.summary_id is not None:
        return "archived", message.summary
    return ("replaced" if message.replaced_at else "active"), None


def transcript_groups(views: Iterable[MessageView]) -> list[Group]:
    """``views`` (in seq order) grouped by state: archived messages under the summary
    version that archived them (``select_related("summary")`` spares a query each)."""
    return [
        Group(kind=kind, summary=summary, messages=list(rows))
        for (kind, summary), rows in itertools.groupby(views, key=_state)
    ]
