"""The chat turn's settings: keys of the one ``CTXSUM`` dict, read through
``chat_settings``, which falls back to ``DEFAULTS`` and reloads with the core's settings
(``ctxsum.conf``). ``ctxsum.chat.checks`` reports invalid values."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxsum.conf import CtxsumSettings


class ChatDefaults:
    """The CHAT_* keys of ``CTXSUM``: the type of a valid value and the default."""

    # The chat turn (POST .../chat/, chat_turn). Its primary model is the request's
    # ``model``, else the conversation's, else DEFAULT_MODEL; these are tried in order after
    # it when it fails (after its retries).
    CHAT_FALLBACK_MODELS: list[str] = []
    # Options of the chat model's client: base_url, api_key (default: OPENAI_BASE_URL /
    # OPENAI_API_KEY), extra_body (extra JSON fields), max_tokens_param
    # ("max_completion_tokens", or "max_tokens" for older servers).
    CHAT_OPTIONS: dict[str, Any] = {}
    # Seconds one chat model request may take (between two chunks when streaming).
    CHAT_TIMEOUT: float = 60
    # Retries of one model after a transient error (429, 408, 409, 5xx, timeout, connection),
    # waiting CHAT_RETRY_BACKOFF seconds before the first, doubling each time.
    CHAT_RETRIES: int = 2
    CHAT_RETRY_BACKOFF: float = 0.5
    # Chat turns (model calls) a conversation may make in all, and a user per UTC day
    # (None: no limit). A reservation is taken before anything else and given back when the
    # turn fails; summarizer calls never count.
    CHAT_MAX_CALLS_PER_CONVERSATION: int | None = None
    CHAT_MAX_CALLS_PER_USER_PER_DAY: int | None = None
    # Seconds a conversation's turn lock holds: a turn older than this is taken for
    # abandoned (its worker died) and the next turn takes the lock over.
    CHAT_TURN_SECONDS: float = 600


DEFAULTS: dict[str, Any] = {
    name: getattr(ChatDefaults, name) for name in ChatDefaults.__annotations__
}

# To the type checker, the attributes of ChatDefaults (as ctxsum.conf does for the core's).
if TYPE_CHECKING:
    _Typed = ChatDefaults
else:
    _Typed = object


class ChatSettings(CtxsumSettings, _Typed):
    """The CHAT_* keys of ``CTXSUM``, with their defaults."""


chat_settings = ChatSettings(DEFAULTS)
