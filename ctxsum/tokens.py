"""Token counting with tiktoken, following OpenAI's chat accounting (its cookbook: 3 tokens
per message, 1 per name). Non-text parts are estimated, since their real cost needs data we
do not decode. Encodings are loaded once per process and shared by every thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ctxsum.conf import ctxsum_settings

if TYPE_CHECKING:
    from tiktoken import Encoding

MESSAGE_OVERHEAD = 3
NAME_OVERHEAD = 1
TOOL_CALL_OVERHEAD = 3
REPLY_PRIMING = 3
IMAGE_LOW_TOKENS = 85
IMAGE_TOKENS = 765  # a 1024x1024 image at high detail: 85 + 4 tiles x 170
AUDIO_TOKENS = 300
FILE_TOKENS = 1000
FALLBACK_ENCODING = "o200k_base"


@functools.cache
def get_encoding(name: str) -> Encoding:
    import tiktoken

    return tiktoken.get_encoding(name)


@functools.cache
def encoding_name_for_model(model: str) -> str:
    import tiktoken

    try:
        return tiktoken.encoding_name_for_model(model)
    except KeyError:
        return FALLBACK_ENCODING


def encoding_for(model: str | None = None) -> Encoding:
    """The encoding for ``model``: ENCODING if set, else tiktoken's, else the fallback."""
    name = ctxsum_settings.ENCODING or encoding_name_for_model(
        model or ctxsum_settings.DEFAULT_MODEL
    )
    return get_encoding(name)


def count_text(text: str, *, model: str | None = None) -> int:
    return len(encoding_for(model).encode(text, disallowed_special=()))


def _count_part(part: Mapping[str, Any], encode: Callable[[str], list[int]]) -> int:
    kind = part.get("type")
    if kind in ("text", "refusal"):
        return len(encode(part.get(kind) or ""))
    if kind == "image_url":
        detail = (part.get("image_url") or {}).get("detail")
        return IMAGE_LOW_TOKENS if detail == "low" else IMAGE_TOKENS
    if kind == "input_audio":
        return AUDIO_TOKENS
    if kind == "file":
        return FILE_TOKENS + len(encode((part.get("file") or {}).get("filename") or ""))
    return 0


def count_message(message: Mapping[str, Any], *, model: str | None = None) -> int:
    """Tokens one OpenAI-format message costs in a chat request."""
    encoding = encoding_for(model)

    def encode(text: str) -> list[int]:
        return encoding.encode(text, disallowed_special=())

    total = MESSAGE_OVERHEAD + len(encode(message["role"]))
    content = message.get("content")
    if isinstance(content, str):
        total += len(encode(content))
    elif content:
        total += sum(_count_part(part, encode) for part in content)
    if isinstance(message.get("refusal"), str):
        total += len(encode(message["refusal"]))
    if message.get("name"):
        total += NAME_OVERHEAD + len(encode(message["name"]))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        total += TOOL_CALL_OVERHEAD + len(encode(function["name"]))
        total += len(encode(function["arguments"]))
    if message.get("tool_call_id"):
        total += len(encode(message["tool_call_id"]))
    return total


def context_tokens(message_tokens: Iterable[int]) -> int:
    """Tokens of a whole request made of messages costing ``message_tokens``."""
    return sum(message_tokens) + REPLY_PRIMING
