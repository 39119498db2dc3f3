"""The chat model's client: one chat completions request, plain or streamed, against any
OpenAI-compatible base URL (``CHAT_OPTIONS``), with the client's own retries off: the turn's
model calls (``ctxsum.chat.model_calls``) retry and fall back themselves, so they see every
attempt."""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import openai

from ctxsum.chat.completions import Usage, reply_message
from ctxsum.chat.conf import chat_settings
from ctxsum.chat.exceptions import ModelError
from ctxsum.summarizers.openai import MAX_TOKENS_PARAMS, error_detail, openai_client

OPTIONS = {"base_url": str, "api_key": str, "extra_body": dict, "max_tokens_param": str}
# Statuses worth another try: timeout, conflict (a lock on the provider's side), rate
# limit, and every server error (the openai client's own choice).
TRANSIENT_STATUSES = frozenset({408, 409, 429})

TIMED_OUT = "The model timed out after {timeout:g}s."
HTTP_ERROR = "The model answered HTTP {status}."
CONNECTION_FAILED = "Could not connect to the chat model."
MALFORMED_RESPONSE = "The model returned a malformed response."
STREAM_BROKEN = "The model's stream broke off: {error}."
STREAM_UNFINISHED = "The model's stream ended without a finish reason."
CALL_FAILED = "The model call failed."

_lock = threading.Lock()
_cached: tuple[str, openai.OpenAI] | None = None
_acached: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[str, openai.AsyncOpenAI]]
_acached = weakref.WeakKeyDictionary()


@dataclass(frozen=True, kw_only=True)
class Completion:
    """A model's answer: the reply as an assistant message, and what came with it."""

    message: dict[str, Any]
    finish_reason: str
    usage: Usage


def chat_client() -> openai.OpenAI:
    """The client for CHAT_OPTIONS and CHAT_TIMEOUT, built once per configuration (so its
    connection pool lives for the process) and rebuilt when they change."""
    global _cached
    options = chat_settings.CHAT_OPTIONS or {}
    key = json.dumps([options, chat_settings.CHAT_TIMEOUT], sort_keys=True, default=str)
    cached = _cached
    if cached is not None and cached[0] == key:
        return cached[1]
    with _lock:
        if _cached is None or _cached[0] != key:
            try:
                client = openai_client(options, timeout=chat_settings.CHAT_TIMEOUT)
            except openai.OpenAIError as exc:
                raise ModelError(f"{CALL_FAILED} {exc}", cause=exc) from exc
            _cached = (key, client)
        return _cached[1]


def achat_client() -> openai.AsyncOpenAI:
    """``chat_client`` for async code: one ``openai.AsyncOpenAI`` per event loop (a client's
    connections belong to the loop that opened them), rebuilt when the options change."""
    options = chat_settings.CHAT_OPTIONS or {}
    key = json.dumps([options, chat_settings.CHAT_TIMEOUT], sort_keys=True, default=str)
    loop = asyncio.get_running_loop()
    cached = _acached.get(loop)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        client = openai_client(
            options, timeout=chat_settings.CHAT_TIMEOUT, client_class=openai.AsyncOpenAI
        )
    except openai.OpenAIError as exc:
        raise ModelError(f"{CALL_FAILED} {exc}", cause=exc) from exc
    _acached[loop] = (key, client)
    return client


def request_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The turn's options as keyword arguments of ``chat.completions.create``."""
    settings = chat_settings.CHAT_OPTIONS or {}
    extra = {key: value for key, value in options.items() if key != "max_completion_tokens"}
    if "max_completion_tokens" in options:
        param = settings.get("max_tokens_param") or MAX_TOKENS_PARAMS[0]
        extra[param] = options["max_completion_tokens"]
    if settings.get("extra_body"):
        extra["extra_body"] = dict(settings["extra_body"])
    return extra


def complete(
    *, model: str, messages: list[dict[str, Any]], options: Mapping[str, Any]
) -> Completion:
    """One chat completion; raises ModelError."""
    return _completion(_create(options, model=model, messages=messages))


def stream(
    *, model: str, messages: list[dict[str, Any]], options: Mapping[str, Any]
) -> Iterator[dict[str, Any]]:
    """The chunks of one streamed chat completion, as dicts, the usage chunk last; raises
    ModelError when the request fails or the stream breaks off. Nothing is sent before the
    first ``next()``."""
    response = _create(
        options,
        model=model,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    try:
        for chunk in response:
            yield chunk.to_dict(mode="json", exclude_unset=True)
    except Exception as exc:
        # Mid-body: the connection dropped (openai wraps the HTTP library's error in an
        # APIConnectionError), or the provider sent an error event.
        broken = STREAM_BROKEN.format(error=exc)
        raise ModelError(broken, transient=True, cause=exc) from exc
    finally:
        response.close()


async def acomplete(
    *, model: str, messages: list[dict[str, Any]], options: Mapping[str, Any]
) -> Completion:
    """``complete`` through ``openai.AsyncOpenAI``."""
    return _completion(await _acreate(options, model=model, messages=messages))


async def astream(
    *, model: str, messages: list[dict[str, Any]], options: Mapping[str, Any]
) -> AsyncGenerator[dict[str, Any], None]:
    """``stream`` through ``openai.AsyncOpenAI``: the same chunks and errors."""
    response = await _acreate(
        options,
        model=model,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    try:
        async for chunk in response:
            yield chunk.to_dict(mode="json", exclude_unset=True)
    except Exception as exc:
        broken = STREAM_BROKEN.format(error=exc)
        raise ModelError(broken, transient=True, cause=exc) from exc
    finally:
        await response.close()


async def _acreate(options: Mapping[str, Any], **params: Any) -> Any:
    create: Any = achat_client().chat.completions.create
    try:
        return await create(**params, **request_options(options))
    except Exception as exc:
        raise model_error(exc) from exc


def _create(options: Mapping[str, Any], **params: Any) -> Any:
    # The messages and options were checked by ctxsum, not typed as the client's params.
    # CHAT_OPTIONS are read inside the try: a bad one (the checks do not run under every
    # server) fails the call as a ModelError, as any other error of the request does.
    create: Any = chat_client().chat.completions.create
    try:
        return create(**params, **request_options(options))
    except Exception as exc:
        raise model_error(exc) from exc


def model_error(exc: BaseException) -> ModelError:
    """An exception of the openai client as a ModelError that says whether to retry."""
    # APITimeoutError is an APIConnectionError: it must come first.
    if isinstance(exc, openai.APITimeoutError):
        timeout = float(chat_settings.CHAT_TIMEOUT)
        return ModelError(TIMED_OUT.format(timeout=timeout), transient=True, cause=exc)
    if isinstance(exc, openai.APIConnectionError):
        return ModelError(CONNECTION_FAILED, transient=True, cause=exc)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = HTTP_ERROR.format(status=status)
        detail = error_detail(exc.body)
        transient = status in TRANSIENT_STATUSES or status >= 500
        return ModelError(
            f"{message} {detail}".strip(), transient=transient, status=status, cause=exc
        )
    if isinstance(exc, openai.APIResponseValidationError | ValueError):
        return ModelError(MALFORMED_RESPONSE, cause=exc)
    return ModelError(f"{CALL_FAILED} {type(exc).__name__}: {exc}", cause=exc)


def _completion(response: Any) -> Completion:
    """The answer of a chat completion; a malformed one is a ModelError (the client does
    not validate: a non-JSON body comes back as a str, missing fields as missing attributes)."""
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise ModelError(MALFORMED_RESPONSE)
    message = getattr(choices[0], "message", None)
    if message is None:
        raise ModelError(MALFORMED_RESPONSE)
    tool_calls = [_tool_call(call) for call in getattr(message, "tool_calls", None) or []]
    return Completion(
        message=reply_message(
            content=getattr(message, "content", None),
            refusal=getattr(message, "refusal", None),
            tool_calls=tool_calls,
        ),
        finish_reason=str(getattr(choices[0], "finish_reason", None) or ""),
        usage=Usage.from_provider(getattr(response, "usage", None)),
    )


def _tool_call(call: Any) -> dict[str, Any]:
    """A tool call of a reply in OpenAI's shape, nothing else (the message validation
    checks the values)."""
    function = getattr(call, "function", None)
    return {
        "id": getattr(call, "id", None),
        "type": getattr(call, "type", None),
        "function": {
            "name": getattr(function, "name", None),
            "arguments": getattr(function, "arguments", None),
        },
    }
