"""Old messages turned into one role-preserving text for the summarizer: pure, no I/O.

Each message is a block inside XML-like tags (``<user seq="12">``, ``<tool-call>``,
``<tool-result>``…); text is escaped, so no message can close a tag or forge another role,
and media become placeholders such as ``[image]``.
"""

from __future__ import annotations

import html
import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxsum.policy import Message, pair_tool_results

ROLE_TAGS = frozenset({"system", "developer", "user", "assistant"})
BUDGET_TOO_SMALL = "budget must be at least 1 token, not {budget!r}."
SEQS_MISMATCH = "{seqs} seqs for {messages} messages."
CHARACTER_OVER_BUDGET = "a single character costs more than the budget of {budget} tokens."


def escape_text(text: str) -> str:
    """``text`` with & < > escaped, so it cannot close or open a tag."""
    return html.escape(text, quote=False)


def escape_attribute(value: str) -> str:
    """``value`` escaped for a double-quoted attribute (quotes too)."""
    return html.escape(value, quote=True)


def _part_text(part: object) -> str:
    if not isinstance(part, Mapping):
        return "[unknown]"
    kind = part.get("type")
    if kind == "text":
        return escape_text(str(part.get("text") or ""))
    if kind == "image_url":
        return "[image]"
    if kind == "input_audio":
        return "[audio]"
    if kind == "file":
        filename = (part.get("file") or {}).get("filename")
        return f"[file {escape_text(str(filename))}]" if filename else "[file]"
    return f"[{escape_text(kind)}]" if isinstance(kind, str) and kind else "[unknown]"


def content_text(content: object) -> str:
    """A message's content as escaped text: text parts joined, media as placeholders."""
    if content is None:
        return ""
    if isinstance(content, str):
        return escape_text(content)
    if isinstance(content, Mapping):
        return _part_text(content)
    if isinstance(content, Sequence):
        return "\n".join(_part_text(part) for part in content)
    return "[unknown]"


def _attributes(**values: object) -> str:
    return "".join(
        f' {key}="{escape_attribute(str(value))}"'
        for key, value in values.items()
        if value is not None and value != ""
    )


def _tool_call(call: Mapping[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = "" if arguments is None else json.dumps(arguments, default=str)
    attributes = _attributes(id=call.get("id"), name=function.get("name"))
    return f"<tool-call{attributes}>{escape_text(arguments)}</tool-call>"


def _requested_name(request: Message, call_id: object) -> str | None:
    for call in request.get("tool_calls") or ():
        if call.get("id") == call_id:
            return (call.get("function") or {}).get("name")
    return None


def _blocks(messages: Sequence[Message], seqs: Sequence[int] | None = None) -> list[str]:
    """Each message as one tagged block, with its seq when ``seqs`` are given."""
    if seqs is not None and len(seqs) != len(messages):
        raise ValueError(SEQS_MISMATCH.format(seqs=len(seqs), messages=len(messages)))
    requests = pair_tool_results(messages)
    blocks = []
    for index, message in enumerate(messages):
        role = message.get("role")
        text = content_text(message.get("content"))
        seq = seqs[index] if seqs is not None else None
        if role == "tool":
            call_id = message.get("tool_call_id")
            request = requests.get(index)
            name = _requested_name(messages[request], call_id) if request is not None else None
            attributes = _attributes(seq=seq, id=call_id, name=name or message.get("name"))
            blocks.append(f"<tool-result{attributes}>{text}</tool-result>")
        elif role in ROLE_TAGS:
            if role == "assistant":
                text += "".join(_tool_call(call) for call in message.get("tool_calls") or ())
            attributes = _attributes(seq=seq, name=message.get("name"))
            blocks.append(f"<{role}{attributes}>{text}</{role}>")
        else:
            attributes = _attributes(seq=seq, role=role, name=message.get("name"))
            blocks.append(f"<message{attributes}>{text}</message>")
    return blocks


def format_messages(messages: Sequence[Message], *, seqs: Sequence[int] | None = None) -> str:
    """The messages as one text for the summarizer, one tagged block per message; with
    ``seqs``, each block names its message's seq (``<user seq="12">``)."""
    return "\n".join(_blocks(messages, seqs))


def with_summary_so_far(summary: str | None, history: str) -> str:
    """The summarizer input: the previous summary first (if any), then the new history."""
    if not summary:
        return history
    block = f"<summary-so-far>{escape_text(summary)}</summary-so-far>"
    return f"{block}\n{history}" if history else block


def chunk_history(
    messages: Sequence[Message],
    *,
    budget: int,
    count: Callable[[str], int],
    seqs: Sequence[int] | None = None,
) -> list[str]:
    """The formatted history split into chunks of at most ``budget`` tokens (per ``count``),
    between messages where possible, by lines and then characters within one too large:
    ``"".join(chunks) == format_messages(messages, seqs=seqs)``."""
    if type(budget) is not int or budget < 1:
        raise ValueError(BUDGET_TOO_SMALL.format(budget=budget))
    blocks = _blocks(messages, seqs)
    segments: list[tuple[str, int]] = []
    for index, block in enumerate(blocks):
        if index < len(blocks) - 1:
            block += "\n"
        cost = count(block)
        if cost <= budget:
            segments.append((block, cost))
        else:
            segments.extend(_split(block, budget, count))
    return _pack(segments, budget, count)


def _split(text: str, budget: int, count: Callable[[str], int]) -> list[tuple[str, int]]:
    """``text`` cut into consecutive pieces each within budget: whole lines where possible."""
    pieces = []
    for line in text.splitlines(keepends=True):
        cost = count(line)
        if cost <= budget:
            pieces.append((line, cost))
            continue
        begin = 0
        while begin < len(line):
            length = _longest_prefix(line, begin, budget, count)
            if length == 0:
                raise ValueError(CHARACTER_OVER_BUDGET.format(budget=budget))
            piece = line[begin : begin + length]
            pieces.append((piece, count(piece)))
            begin += length
    return pieces


def _longest_prefix(text: str, begin: int, budget: int, count: Callable[[str], int]) -> int:
    """The length of the longest prefix of ``text[begin:]`` within budget: galloping then
    bisecting, so ``count`` calls stay logarithmic in a line megabytes long."""
    remaining = len(text) - begin
    good, probe = 0, 1
    while True:
        probe = min(probe, remaining)
        if count(text[begin : begin + probe]) > budget:
            bad = probe
            break
        good = probe
        if probe == remaining:
            return good
        probe *= 2
    while bad - good > 1:
        middle = (good + bad) // 2
        if count(text[begin : begin + middle]) <= budget:
            good = middle
        else:
            bad = middle
    return good


def _pack(
    segments: Sequence[tuple[str, int]], budget: int, count: Callable[[str], int]
) -> list[str]:
    """Consecutive segments (each within budget) joined greedily into chunks within budget."""
    chunks = []
    pending = deque(segments)
    while pending:
        taken = [pending.popleft()]
        estimate = taken[0][1]
        while pending and estimate + pending[0][1] <= budget:
            estimate += pending[0][1]
            taken.append(pending.popleft())
        # Token counts of joined text need not equal the sum of the parts' counts; verify
        # the real chunk and hand segments back to the next chunk until it fits.
        chunk = "".join(text for text, _ in taken)
        while len(taken) > 1 and count(chunk) > budget:
            pending.appendleft(taken.pop())
            chunk = "".join(text for text, _ in taken)
        chunks.append(chunk)
    return chunks
