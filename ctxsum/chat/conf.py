"""The chat turn's settings: keys of the one ``CTXSUM`` dict, read through
``chat_settings``, which falls back to ``DEFAULTS`` and reloads with the core's settings
(``ctxsum.conf``). ``ctxsum.chat.checks`` reports invalid values."""

from __future__ import annotations

from typing import Any

from ctxsum.conf import CtxsumSettings

DEFAULTS: dict[str, Any] = {
    # The chat turn (POST .../chat/, chat_turn). Its primary model is the request's
    # ``model``, else the conversation's, else DEFAULT_MODEL; these are tried in order after
    # it when it fails (after its retries).
    "CHAT_FALLBACK_MODELS": [],
    # Options of the chat model's client: base_url, api_key (default: OPENAI_BASE_URL /
    # OPENAI_API_KEY), extra_body (extra JSON fields), max_tokens_param
    # ("max_completion_tokens", or "max_tokens" for older servers).
    "CHAT_OPTIONS": {},
    # Seconds one chat model request may take (between two chunks when streaming).
    "CHAT_TIMEOUT": 60,
    # Retries of one model after a transient error (429, 408, 409, 5xx, timeout, connection),
    # waiting CHAT_RETRY_BACKOFF seconds before the first, doubling each time.
    "CHAT_RETRIES": 2,
    "CHAT_RETRY_BACKOFF": 0.5,
    # Chat turns (model calls) a conversation may make in all, and a user per UTC day
    # (None: no limit). A reservation is taken before anything else and given back when the
    # turn fails; summarizer calls never count.
    "CHAT_MAX_CALLS_PER_CONVERSATION": None,
    "CHAT_MAX_CALLS_PER_USER_PER_DAY": None,
    # Seconds a conversation's turn lock holds: a turn older than this is taken for
    # abandoned (its worker died) and the next turn takes the lock over.
    "CHAT_TURN_SECONDS": 600,
}


class ChatSettings(CtxsumSettings):
    """The CHAT_* keys of ``CTXSUM``, with their defaults."""

    CHAT_FALLBACK_MODELS: list[str]
    CHAT_OPTIONS: dict[str, Any]
    CHAT_TIMEOUT: float
    CHAT_RETRIES: int
    CHAT_RETRY_BACKOFF: float
    CHAT_MAX_CALLS_PER_CONVERSATION: int | None
    CHAT_MAX_CALLS_PER_USER_PER_DAY: int | None
    CHAT_TURN_SECONDS: float


chat_settings = ChatSettings(DEFAULTS)
