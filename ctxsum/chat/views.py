"""The chat turn over REST: one call of ``chat_turn``, answered as JSON or as server-sent
events (docs/architecture.md, "The chat turn"). Its route joins the core's through
``ctxsum.chat.urls``.

Under WSGI the view runs the turn itself, and a stream is a synchronous iterator. Under
ASGI the view checks the request (authentication, body, Idempotency-Key) and hands the
turn to ``chat_view``, which runs it with ``achat_turn`` on the event loop: the model's
answer streams as it comes, and no thread or database connection waits on the model."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import wraps
from typing import Any

from asgiref.sync import markcoroutinefunction, sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from ctxsum.api import schema
from ctxsum.api.base import CtxsumView
from ctxsum.api.errors import ServerError, error_body, invalid_body
from ctxsum.api.exceptions import api_exception
from ctxsum.api.idempotency import REFUSALS, IdempotencyConflict, answer_store, idempotent
from ctxsum.chat import schema as chat_schema
from ctxsum.chat.completions import sse
from ctxsum.chat.serializers import ChatInputSerializer, ChatOutputSerializer
from ctxsum.chat.services import ChatResult, ChatStream, achat_turn, chat_turn
from ctxsum.exceptions import MessagesInvalid
from ctxsum.services import Claim, Found, LeaseLost, key_answer, key_release
from ctxsum.threads import database_executor, database_sync_to_async

logger = logging.getLogger("ctxsum.api")

ANSWER_FAILED = "Conversation %s: a streamed chat turn was stored, but its answer failed."
KEY_ANSWER_FAILED = (
    "Conversation %s: a streamed chat turn was stored, but its Idempotency-Key's answer "
    "could not be."
)


class ConversationChat(CtxsumView):
    serializer_class = ChatInputSerializer

    @idempotent
    @schema.operation(
        "conversations_chat",
        "One model turn: the new message and the model's reply, stored together",
        ChatOutputSerializer,
        errors_too=[409, 429, 502],
        streamed=chat_schema.SERVER_SENT_EVENTS,
        description='With `"stream": true` the answer is `text/event-stream`: every chunk '
        "of the model's answer as `data: {chat.completion.chunk}`, then `event: ctxsum` "
        "whose data is this operation's JSON answer, then `data: [DONE]`; a failure after "
        'the first chunk is `event: error` with `{"detail", "code"}`, and nothing is '
        "stored. A failure before it is an ordinary JSON error. A stored turn always "
        "answers 200 (a stream ends with its `ctxsum` event): `stats` is null when they "
        "could not be read after the commit. A blank answer of the model is retried and "
        "never stored. A retry with the "
        "Idempotency-Key of a turn that was stored answers that turn's JSON answer (the "
        "`ctxsum` event's data, streamed or not) and calls no model.",
    )
    def post(self, request: Request, pk: str) -> Response | StreamingHttpResponse:
        conversation = self.get_conversation()
        fields = {k: v for k, v in self.validated(ChatInputSerializer).items() if v is not None}
        if isinstance(request._request, ASGIRequest):
            return TurnPending(self, conversation, fields)
        try:
            result = chat_turn(
                conversation=conversation,
                message=fields.pop("message", None),
                stream=fields.pop("stream", False),
                user=request.user,
                idempotency=self.idempotency,
                **fields,
            )
            # The first event comes before the first byte: a failure to reach the model
            # (after its retries and fallbacks) is still an ordinary JSON error.
            first = next(result) if isinstance(result, ChatStream) else None
        except MessagesInvalid as error:
            raise exceptions.ValidationError({"message": error.per_message[0]}) from error
        if not isinstance(result, ChatStream):
            return Response(ChatOutputSerializer(result).data)
        return _event_stream(_events(result, first, self.idempotency))

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # An EventSource asks for text/event-stream: answered as such when streaming, and
        # errors as JSON, like every other error of the API.
        if "text/event-stream" in request.META.get("HTTP_ACCEPT", ""):
            return (JSONRenderer(), JSONRenderer.media_type)
        return super().perform_content_negotiation(request, force)


# The chat turns' database work under ASGI, every turn's of the process: one thread, so one
# connection however many turns stream (docs/how-to/deploy.md).
DATABASE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxsum-chat-db")


class TurnPending(StreamingHttpResponse):
    """What the view answers under ASGI: the checked request, for ``chat_view`` to run.
    Never sent: ``chat_view`` answers in its place. A streaming response, so that
    ``@idempotent`` leaves its Idempotency-Key to it."""

    def __init__(self, view: ConversationChat, conversation: Any, fields: dict[str, Any]):
        super().__init__(())
        self.view, self.conversation, self.fields = view, conversation, dict(fields)
        self.claim = view.idempotency

    async def answer(self) -> HttpResponseBase:
        """Run the turn, as the view does under WSGI: a failure before the model's first
        chunk is an ordinary JSON error, the key given back; a stored turn's answer is
        stored on the key."""
        fields, claim = dict(self.fields), self.claim
        try:
            result = await achat_turn(
                conversation=self.conversation,
                message=fields.pop("message", None),
                stream=fields.pop("stream", False),
                user=self.view.request.user,
                idempotency=claim,
                **fields,
            )
            first = await anext(result) if isinstance(result, ChatStream) else None
        except BaseException as error:
            # The key given back, a client gone (the task cancelled) too.
            if claim is not None:
                await database_sync_to_async(key_release)(claim)
            if not isinstance(error, Exception):
                raise
            return await database_sync_to_async(self._error)(error)
        if isinstance(result, ChatStream):
            return _event_stream(_aevents(result, first, claim))
        return await database_sync_to_async(self._stored)(result)

    def _error(self, error: Exception) -> HttpResponseBase:
        """``error`` answered as the view answers it."""
        if isinstance(error, MessagesInvalid):
            error = exceptions.ValidationError({"message": error.per_message[0]})
        elif isinstance(error, LeaseLost):
            # The key's claim was taken over by a retry: that one runs, this one stops.
            error = IdempotencyConflict(*REFUSALS[Found.IN_PROGRESS])
        view = self.view
        return view.finalize_response(view.request, view.handle_exception(error))

    def _stored(self, result: ChatResult) -> HttpResponseBase:
        response = Response(ChatOutputSerializer(result).data)
        if self.claim is not None:
            answer_store(self.claim, response)
        view = self.view
        return view.finalize_response(view.request, response)


def chat_view(drf_view: Callable[..., HttpResponseBase]) -> Callable[..., Any]:
    """The chat route's view: ``drf_view`` (``ConversationChat.as_view()``), and under
    ASGI the turn it hands on (``TurnPending``) run on the event loop."""

    # Its class, CSRF exemption (DRF checks CSRF itself) and non-atomic requests are
    # drf_view's: what the URL resolver, the schema and the middleware read.
    @wraps(drf_view)
    async def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not isinstance(request, ASGIRequest):
            return await sync_to_async(drf_view)(request, *args, **kwargs)
        with database_executor(DATABASE):
            response = await database_sync_to_async(drf_view)(request, *args, **kwargs)
            if isinstance(response, TurnPending):
                return await response.answer()
        return response

    return markcoroutinefunction(view)


def _event_stream(events: Iterator[bytes] | AsyncIterator[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


async def _aevents(stream: ChatStream, first: Any, claim: Claim | None) -> AsyncIterator[bytes]:
    """``_events`` of a stream iterated with ``async for``: the database's work (the
    commit, the answer, the key) in the chat turns' database thread (``DATABASE``)."""
    stored = False
    try:
        event = first
        while True:
            if isinstance(event, ChatResult):
                stored = True
                with database_executor(DATABASE):
                    answer = await database_sync_to_async(_stored_list)(event, claim)
                for chunk in answer:
                    yield chunk
            else:
                yield sse(event)
            try:
                with database_executor(DATABASE):
                    event = await anext(stream)
            except StopAsyncIteration:
                break
    except Exception as error:
        if stored:
            logger.exception(ANSWER_FAILED, stream.turn.reservation.conversation_pk)
        else:
            yield sse(_stream_error(error), event="error")
    finally:
        with database_executor(DATABASE):
            await stream.aclose()
            if claim is not None and not stored:
                await database_sync_to_async(key_release)(claim)


def _stored_list(result: ChatResult, claim: Claim | None) -> list[bytes]:
    return list(_stored_events(result, claim))


def _events(stream: ChatStream, first: Any, claim: Claim | None) -> Iterator[bytes]:
    """The streamed turn as server-sent events (docs/architecture.md, "The chat turn"). The
    stream answers for an Idempotency-Key's ``claim`` itself: it stores the turn's answer
    once the turn is stored, and gives the key back when it ends without one."""
    stored = False
    try:
        for event in itertools.chain([first], stream):
            if isinstance(event, ChatResult):
                # Stored: from here on the stream ends with its answer, whatever fails.
                stored = True
                yield from _stored_events(event, claim)
            else:
                yield sse(event)
    except Exception as error:
        if stored:
            # Never an error event for a stored turn: it would say the turn failed.
            logger.exception(ANSWER_FAILED, stream.turn.reservation.conversation_pk)
        else:
            yield sse(_stream_error(error), event="error")
    finally:
        stream.close()
        if claim is not None and not stored:
            key_release(claim)


def _stored_events(result: ChatResult, claim: Claim | None) -> Iterator[bytes]:
    """The ``ctxsum`` event and ``[DONE]`` of a stored turn. Built from what can be read
    (``stats`` is null when they cannot be: ChatOutputSerializer); a key whose answer cannot
    be stored is logged, and a retry with it is told the turn was applied."""
    answer = ChatOutputSerializer(result).data
    if claim is not None:
        try:
            key_answer(claim, status=status.HTTP_200_OK, data=answer)
        except Exception:
            logger.exception(KEY_ANSWER_FAILED, result.conversation.pk)
    yield sse(JSONRenderer().render(answer).decode(), event="ctxsum")
    yield sse("[DONE]")


def _stream_error(error: Exception) -> dict[str, str]:
    """The body of a mid-stream ``event: error``: what the JSON error would have said."""
    if isinstance(error, MessagesInvalid):
        return invalid_body({"message": error.per_message[0]})
    mapped = api_exception(error)
    if isinstance(mapped, exceptions.APIException):
        return error_body(mapped.detail, str(mapped.default_code))
    logger.error("Unexpected error in a chat stream", exc_info=error)
    return error_body(ServerError.default_detail, ServerError.default_code)
