"""The chat model call of a turn: the primary model, each transient error (429, 408, 409,
5xx, timeout, connection) retried CHAT_RETRIES times with a doubling backoff, then each of
CHAT_FALLBACK_MODELS; any other error moves on to the next model at once. The summarizer
never comes through here: it makes one attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Iterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from ctxsum.chat import client
from ctxsum.chat.conf import chat_settings
from ctxsum.chat.exceptions import ModelError
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import MessagesInvalid, TooLarge
from ctxsum.validation import clean_message

logger = logging.getLogger("ctxsum.chat")

EXHAUSTED = "The model failed after {attempts} attempt(s) with {models}: {error}"
BAD_REPLY = "The model's reply is not a valid message: {errors}"
BLANK_REPLY = "The model's reply is blank: no text, no tool call, no refusal."


@dataclass
class Attempts:
    """The models a turn may try, and how far it got: what the turn records."""

    models: list[str]
    index: int = 0
    retry: int = 0
    count: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def model(self) -> str:
        return self.models[self.index]

    @property
    def latency_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    def failed(self, error: ModelError) -> float:
        """After a failed attempt: the seconds to wait for the same model's retry (its
        backoff), or none to move on to the next model; raises the turn's ModelError when
        every model is spent."""
        logger.warning("Chat model %s failed (attempt %d): %s", self.model, self.count, error)
        if error.transient and self.retry < chat_settings.CHAT_RETRIES:
            self.retry += 1
            return float(chat_settings.CHAT_RETRY_BACKOFF * 2 ** (self.retry - 1))
        if self.index + 1 < len(self.models):
            self.index, self.retry = self.index + 1, 0
            return 0.0
        models = ", ".join(self.models)
        message = EXHAUSTED.format(attempts=self.count, models=models, error=error)
        exhausted = ModelError(message, transient=error.transient, status=error.status, cause=error)
        raise exhausted from error


def model_chain(primary: str) -> list[str]:
    """The primary model, then each fallback model once."""
    return list(dict.fromkeys([primary, *(chat_settings.CHAT_FALLBACK_MODELS or ())]))


def reply_clean(message: dict[str, Any]) -> dict[str, Any]:
    """The model's reply, checked as any appended message is; a ModelError when it is not a
    message the conversation could store (it could not be sent back either), and a
    transient one when it is blank: a failed attempt, retried like a 5xx, never stored."""
    try:
        cleaned = clean_message(message, max_bytes=ctxsum_settings.MAX_MESSAGE_BYTES)
    except MessagesInvalid as invalid:
        raise ModelError(BAD_REPLY.format(errors=invalid.per_message[0])) from invalid
    except TooLarge as error:
        raise ModelError(BAD_REPLY.format(errors=error)) from error
    if is_blank(cleaned):
        raise ModelError(BLANK_REPLY, transient=True)
    return cleaned


def is_blank(message: Mapping[str, Any]) -> bool:
    """Whether a reply (or a stream chunk's delta) says nothing yet: no tool call, no
    refusal, and content that is missing or whitespace (in every text part)."""
    if message.get("tool_calls") or message.get("refusal"):
        return False
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            str(part.get("text") or "") for part in content if isinstance(part, Mapping)
        )
    return not isinstance(content, str) or not content.strip()


def _says_something(chunk: Mapping[str, Any]) -> bool:
    """Whether a stream chunk carries a part of the reply that is not blank."""
    return any(not is_blank(choice.get("delta") or {}) for choice in chunk.get("choices") or ())


def call_model(
    attempts: Attempts, messages: list[dict[str, Any]], options: dict[str, Any]
) -> tuple[client.Completion, dict[str, Any]]:
    """The first answer any model of ``attempts`` gives, with its reply checked; raises
    ModelError when every attempt failed."""
    while True:
        attempts.count += 1
        try:
            completion = client.complete(model=attempts.model, messages=messages, options=options)
            return completion, reply_clean(completion.message)
        except ModelError as error:
            time.sleep(attempts.failed(error))


async def acall_model(
    attempts: Attempts, messages: list[dict[str, Any]], options: dict[str, Any]
) -> tuple[client.Completion, dict[str, Any]]:
    """``call_model`` through ``openai.AsyncOpenAI``, its backoff awaited."""
    while True:
        attempts.count += 1
        try:
            completion = await client.acomplete(
                model=attempts.model, messages=messages, options=options
            )
            return completion, reply_clean(completion.message)
        except ModelError as error:
            await asyncio.sleep(attempts.failed(error))


def stream_model(
    attempts: Attempts, messages: list[dict[str, Any]], options: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """The chunks of the first stream any model of ``attempts`` opens; retried like
    ``call_model`` until a chunk has been passed on, a ModelError as is after that. Chunks
    are held back until one says something (a blank stream is a failed attempt, like a
    blank reply): the role chunk, empty or whitespace deltas."""
    while True:
        attempts.count += 1
        held = Held()
        try:
            for chunk in client.stream(model=attempts.model, messages=messages, options=options):
                yield from held.add(chunk)
            held.end()
            return
        except ModelError as error:
            time.sleep(held.failed(attempts, error))


async def astream_model(
    attempts: Attempts, messages: list[dict[str, Any]], options: dict[str, Any]
) -> AsyncGenerator[dict[str, Any], None]:
    """``stream_model`` through ``openai.AsyncOpenAI``, its backoff awaited."""
    while True:
        attempts.count += 1
        held = Held()
        try:
            stream = client.astream(model=attempts.model, messages=messages, options=options)
            # Closed here when the turn stops early (the client gone): its response with it.
            async with aclosing(stream):
                async for chunk in stream:
                    for passed in held.add(chunk):
                        yield passed
            held.end()
            return
        except ModelError as error:
            await asyncio.sleep(held.failed(attempts, error))


@dataclass
class Held:
    """One streamed attempt's chunks, held back until one says something."""

    passed_on: bool = False
    chunks: list[dict[str, Any]] = field(default_factory=list)

    def add(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks to pass on now ``chunk`` came: none while nothing was said."""
        self.chunks.append(chunk)
        if not (self.passed_on or _says_something(chunk)):
            return []
        self.passed_on = True
        passed, self.chunks = self.chunks, []
        return passed

    def end(self) -> None:
        """The stream ended: a blank one is a failed attempt (ModelError)."""
        if not self.passed_on:
            raise ModelError(BLANK_REPLY, transient=True)

    def failed(self, attempts: Attempts, error: ModelError) -> float:
        """After ``error``: raised as it is once a chunk was passed on, else the attempt
        failed (``Attempts.failed``: the seconds to wait)."""
        if self.passed_on:
            logger.warning("Chat model %s broke off its stream: %s", attempts.model, error)
            raise error
        return attempts.failed(error)
