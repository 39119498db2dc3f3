"""A session of the OpenAI Agents SDK backed by ctxsum (``pip install ctxsum[agents]``).

``Runner.run(agent, text, session=CtxsumSession(conversation))`` keeps the run's items in a
ctxsum conversation and starts every run from its active context, so a long session is
compacted with nothing else to do:

- ``add_items`` stores the items as chat messages, converted by the SDK's own converter for
  the chat completions API: an assistant's text and its function calls become one assistant
  message with ``tool_calls``, a function call's output a ``tool`` message. What that format
  cannot hold (reasoning items, hosted tools' calls) is not stored, as the SDK's chat
  completions model does not send it. The append may compact the conversation, by the
  conversation's policy and ``CTXSUM["COMPACTION_RUNNER"]``.
- ``get_items`` serves the active context as items: the leading system message, the summary
  and the key facts block (user messages), then the messages after them.
- ``pop_item`` takes back the newest message (``message_pop``) and returns its last item;
  nothing a summary covers is ever taken back, and the system prompt is not: then it
  returns None.
- ``clear_session`` deletes nothing: it starts the session on a new conversation with the
  same owner, settings and system prompt (``conversation_restart``); ``session_id`` and
  ``conversation`` name the new one, and the old one keeps every message and summary.

See docs/architecture.md, "Agent frameworks".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from agents.items import TResponseInputItem
from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings
from agents.models.chatcmpl_converter import Converter

from ctxsum.models import Conversation
from ctxsum.selectors import acontext_get
from ctxsum.services import aconversation_restart, amessage_append, amessage_pop

__all__ = ["CtxsumSession", "as_items", "as_messages"]


class CtxsumSession(SessionABC):
    """The Agents SDK session of ``conversation`` (see the module)."""

    def __init__(
        self, conversation: Conversation, *, session_settings: SessionSettings | None = None
    ) -> None:
        self.conversation = conversation
        self.session_id = str(conversation.pk)
        self.session_settings = session_settings

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The active context as items; with ``limit``, its last ``limit`` items."""
        context = await acontext_get(conversation=self.conversation)
        items = as_items(context.messages)
        if limit is None:
            return items
        return items[-limit:] if limit > 0 else []

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` as one batch, all or none (a ValidationError names what ctxsum
        refused)."""
        messages = as_messages(items)
        if messages:
            await amessage_append(conversation=self.conversation, messages=messages)

    async def pop_item(self) -> TResponseInputItem | None:
        """Take back the newest message and return its last item, or None (see the
        module)."""
        popped = await amessage_pop(conversation=self.conversation)
        if popped is None:
            return None
        return as_items([popped.as_openai()])[-1]

    async def clear_session(self) -> None:
        """Go on in a new conversation; the old one is left whole (see the module)."""
        self.conversation = await aconversation_restart(conversation=self.conversation)
        self.session_id = str(self.conversation.pk)


def as_messages(items: Sequence[TResponseInputItem]) -> list[dict[str, Any]]:
    """``items`` as chat completions messages, by the SDK's converter."""
    return [dict(message) for message in Converter.items_to_messages(list(items))]


def as_items(messages: Sequence[Mapping[str, Any]]) -> list[TResponseInputItem]:
    """Chat completions messages as the SDK's input items."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": _text(message["content"]),
                }
            )
        elif role == "assistant":
            items.extend(_assistant_items(message))
        else:
            items.append({"role": role, "content": _input_content(message["content"])})
    return cast(list[TResponseInputItem], items)


def _assistant_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's text (or refusal), then one item per tool call."""
    text = _text(message.get("content")) or message.get("refusal") or ""
    items: list[dict[str, Any]] = [{"role": "assistant", "content": text}] if text else []
    for call in message.get("tool_calls") or ():
        function = call["function"]
        items.append(
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
            }
        )
    return items


def _text(content: Any) -> str:
    """A message's content as text: a string as it is, the text of its text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _input_content(content: Any) -> Any:
    """A user, system or developer message's content as input content: a string as it is;
    chat content parts as the Responses API's input parts."""
    if isinstance(content, str):
        return content
    return [_input_part(part) for part in content]


def _input_part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"type": "input_text", "text": part["text"]}
    if kind == "image_url":
        image = part["image_url"]
        return {
            "type": "input_image",
            "image_url": image["url"],
            "detail": image.get("detail", "auto"),
        }
    if kind == "file":
        return {"type": "input_file", **part["file"]}
    return dict(part)
