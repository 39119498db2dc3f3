"""REST endpoints: parse the request, call one service or selector, shape the answer."""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connections, transaction
from django.db.models import QuerySet
from django.http import Http404, StreamingHttpResponse
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions, status
from rest_framework.generics import GenericAPIView
from rest_framework.parsers import JSONParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.serializers import Serializer

from ctxsum import selectors, services
from ctxsum.api import schema
from ctxsum.api.errors import ServerError, error_body
from ctxsum.api.idempotency import idempotent, keep_raw_body
from ctxsum.api.pagination import Pagination, TranscriptPagination
from ctxsum.api.serializers import (
    POLICY_KEYS,
    ApiRootOutputSerializer,
    AppendOutputSerializer,
    ChatInputSerializer,
    ChatOutputSerializer,
    CompactInputSerializer,
    CompactionOutputSerializer,
    ContextOutputSerializer,
    ConversationCreateInputSerializer,
    ConversationDetailOutputSerializer,
    ConversationInputSerializer,
    ConversationOutputSerializer,
    EmptyInputSerializer,
    MessageBatchInputSerializer,
    MessageOutputSerializer,
    RebuildOutputSerializer,
    SummaryOutputSerializer,
)
from ctxsum.completions import sse
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import (
    CallLimitReached,
    ContextTooLong,
    MessagesInvalid,
    ModelError,
    SummarizerError,
    TooLarge,
    TurnInProgress,
)
from ctxsum.models import Conversation, Message
from ctxsum.policy import Reason
from ctxsum.services.chat import ChatResult, ChatStream
from ctxsum.services.compaction import failure_reason
from ctxsum.services.idempotency import Claim, key_answer, key_release

logger = logging.getLogger("ctxsum.api")

CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# A seq in a path: what a PositiveIntegerField holds on every database, in decimal.
CANONICAL_SEQ = re.compile(r"0|[1-9][0-9]{0,9}")
MAX_SEQ = 2**31 - 1
CONVERSATION_NOT_FOUND = _("No such conversation.")
MESSAGE_NOT_FOUND = _("No such message in this conversation.")
BODY_TOO_LARGE = _("The request body is {size} bytes; the limit is {limit} bytes.")
SUMMARY_CUT_OFF = _(
    "The summary was cut off at SUMMARY_MAX_TOKENS, so it was not stored; nothing was changed."
)
TOO_DEEP = _("The JSON is nested too deeply.")


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = _("The request is too large.")
    default_code = "too_large"


class LengthRequired(exceptions.APIException):
    status_code = status.HTTP_411_LENGTH_REQUIRED
    default_detail = _("Send the request body with a Content-Length, not chunked.")
    default_code = "length_required"


class SummarizerFailed(exceptions.APIException):
    status_code = status.HTTP_502_BAD_GATEWAY
    default_detail = _("The summarizer failed; nothing was changed.")
    default_code = "summarizer_error"

    def __init__(self, *, reason: Reason) -> None:
        super().__init__(SUMMARY_CUT_OFF if reason == Reason.SUMMARY_TRUNCATED else None)
        self.reason = reason


class TurnConflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = _("Another turn of this conversation is in progress.")
    default_code = "turn_in_progress"


class CallLimit(exceptions.APIException):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_detail = _("A limit of model calls is reached.")
    default_code = "call_limit_reached"

    def __init__(self, detail: str, *, scope: str) -> None:
        super().__init__(detail)
        self.scope = scope


class ContextTooLongError(exceptions.APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = _("The context is over max_context_tokens, even after compaction.")
    default_code = "context_too_long"


class ModelFailed(exceptions.APIException):
    status_code = status.HTTP_502_BAD_GATEWAY
    default_detail = _("The model failed after its retries and fallbacks; nothing was stored.")
    default_code = "model_error"


def _chat_exception(exc: Exception) -> Exception:
    """A chat turn's domain errors as the HTTP errors they mean."""
    if isinstance(exc, TurnInProgress):
        return TurnConflict(str(exc))
    if isinstance(exc, CallLimitReached):
        return CallLimit(str(exc), scope=exc.scope)
    if isinstance(exc, ContextTooLong):
        return ContextTooLongError(str(exc))
    if isinstance(exc, ModelError):
        # The provider's own words go to the log, not to the client: an operational
        # event, not a bug, so no traceback.
        logger.error("Chat model error: %s", exc)
        return ModelFailed()
    if isinstance(exc, SummarizerError):
        return SummarizerFailed(reason=failure_reason(exc))
    return exc


def _api_exception(exc: Exception) -> Exception:
    """Domain errors as the HTTP errors they mean."""
    exc = _chat_exception(exc)
    if isinstance(exc, TooLarge | RequestDataTooBig):
        return PayloadTooLarge(str(exc))
    if isinstance(exc, RecursionError):
        # JSON nested deeper than Python's parser or encoder can follow: bad input.
        return exceptions.ParseError(TOO_DEEP)
    if isinstance(exc, Conversation.DoesNotExist):
        # Deleted by another request between the lookup and the service's locked re-read.
        return exceptions.NotFound(CONVERSATION_NOT_FOUND)
    if isinstance(exc, DjangoValidationError):
        return exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        )
    return exc


class CtxsumView(GenericAPIView[Any]):
    """Shared behaviour: owner-scoped lookups, body limits, domain errors as HTTP errors."""

    pagination_class = Pagination
    # Every endpoint needs a user, whatever the project's DRF defaults say.
    permission_classes = [IsAuthenticated]
    # Bodies are JSON, whatever the project's defaults say: a form or multipart body is a 415
    # (its uploaded files were values no message or field can hold).
    parser_classes = [JSONParser]
    # The Idempotency-Key this request holds, while an ``@idempotent`` method runs.
    idempotency: Claim | None = None
    _conversation: Conversation | None = None

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Any:
        # Services own their transactions: compaction must call the LLM outside of one and
        # an auto compaction must follow a committed append, so ATOMIC_REQUESTS is opted out,
        # on every database.
        view = super().as_view(**initkwargs)
        for alias in connections:
            view = transaction.non_atomic_requests(using=alias)(view)
        return view

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        keep_raw_body(request)
        super().initial(request, *args, **kwargs)
        # Under WSGI a chunked body has no CONTENT_LENGTH, and Django reads it as empty:
        # refused, never taken for an empty request.
        if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            raise LengthRequired
        limit = ctxsum_settings.MAX_BODY_BYTES
        size = int(request.META.get("CONTENT_LENGTH") or 0)
        if size > limit:
            raise PayloadTooLarge(BODY_TOO_LARGE.format(size=size, limit=limit))

    def handle_exception(self, exc: Exception) -> Response:
        exc = _api_exception(exc)
        if not isinstance(exc, exceptions.APIException | Http404 | PermissionDenied):
            logger.error(
                "Unexpected error answering %s %s",
                self.request.method,
                self.request.path,
                exc_info=exc,
            )
            exc = ServerError()
        response = super().handle_exception(exc)
        if isinstance(exc, exceptions.ValidationError) or not isinstance(response.data, dict):
            return response
        # Every other error: its detail and a stable code.
        detail = response.data.get("detail", "")
        code = getattr(detail, "code", None) or getattr(exc, "default_code", "error")
        response.data = {**response.data, **error_body(detail, str(code))}
        if isinstance(exc, SummarizerFailed):
            # summarizer_error, or summary_truncated for an answer cut off at its limit.
            response.data["reason"] = str(exc.reason)
        if isinstance(exc, CallLimit):
            response.data["scope"] = exc.scope
        return response

    def page_response(self, rows: QuerySet[Any], output: type[Serializer[Any]]) -> Response:
        """The requested page of ``rows``, each shaped by ``output``."""
        return self.get_paginated_response(output(self.paginate_queryset(rows), many=True).data)

    def get_queryset(self) -> QuerySet[Conversation]:
        """The conversations the request's user owns: all an endpoint can reach."""
        return selectors.conversation_list(owner=self.request.user)

    def get_conversation(self) -> Conversation:
        """The conversation the path names, looked up once per request."""
        if self._conversation is None:
            self._conversation = self._conversation_lookup()
        return self._conversation

    def _conversation_lookup(self) -> Conversation:
        # Someone else's conversation, a missing one and a malformed id answer alike; an id
        # is its canonical form only (not urn:uuid:…, braces or capitals), one name per
        # conversation.
        pk = self.kwargs["pk"]
        try:
            if not CANONICAL_UUID.fullmatch(pk):
                raise ValueError(pk)
            return self.get_queryset().get(pk=pk)
        except (Conversation.DoesNotExist, DjangoValidationError, ValueError) as error:
            raise exceptions.NotFound(CONVERSATION_NOT_FOUND) from error


def _seq(value: str) -> int:
    """A seq from the path; anything that no message can have is a 404, like a missing one."""
    if not CANONICAL_SEQ.fullmatch(value) or int(value) > MAX_SEQ:
        raise exceptions.NotFound(MESSAGE_NOT_FOUND)
    return int(value)


def _no_fields(request: Request) -> None:
    """Refuse a body that holds anything: these operations take no input."""
    EmptyInputSerializer(data=request.data).is_valid(raise_exception=True)


def _nest_policy_errors(error: DjangoValidationError) -> exceptions.ValidationError:
    """The service names ``trigger``/``keep``/…; over REST they live under ``policy``."""
    errors: dict[str, Any] = dict(error.message_dict)
    nested = {key: errors.pop(key) for key in POLICY_KEYS if key in errors}
    if nested:
        errors["policy"] = nested
    return exceptions.ValidationError(errors)


def _service_fields(validated: dict[str, Any]) -> dict[str, Any]:
    """The validated input as the service's keyword arguments: the policy's keys flattened;
    ``"policy": null`` resets all of them to the settings' defaults."""
    fields = dict(validated)
    if "policy" in fields:
        policy = fields.pop("policy")
        fields.update(dict.fromkeys(POLICY_KEYS) if policy is None else policy)
    return fields


def _detail(conversation: Conversation) -> dict[str, Any]:
    active = selectors.context_get(conversation=conversation)
    return ConversationDetailOutputSerializer(conversation, context={"active": active}).data


class ApiRoot(CtxsumView):
    serializer_class = ApiRootOutputSerializer

    @schema.operation(
        "api_root",
        "Links to the API's collections",
        ApiRootOutputSerializer,
        on_conversation=False,
    )
    def get(self, request: Request) -> Response:
        url = reverse("ctxsum:conversation-list", request=request)
        return Response(ApiRootOutputSerializer({"conversations": url}).data)


class ConversationList(CtxsumView):
    serializer_class = ConversationCreateInputSerializer

    @schema.operation(
        "conversations_list",
        "The caller's conversations, newest first",
        ConversationOutputSerializer(many=True),
        on_conversation=False,
    )
    def get(self, request: Request) -> Response:
        conversations = selectors.conversation_list(owner=request.user)
        return self.page_response(conversations, ConversationOutputSerializer)

    @schema.operation(
        "conversations_create",
        "Create a conversation, with its system prompt and first messages",
        ConversationDetailOutputSerializer,
        status=201,
        request=ConversationCreateInputSerializer,
        errors_too=schema.BODY,
        on_conversation=False,
    )
    def post(self, request: Request) -> Response:
        serializer = ConversationCreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            conversation = services.conversation_create(
                owner=request.user, **_service_fields(serializer.validated_data)
            )
        except MessagesInvalid as error:
            raise exceptions.ValidationError({"messages": error.per_message}) from error
        except DjangoValidationError as error:
            raise _nest_policy_errors(error) from error
        return Response(_detail(conversation), status=status.HTTP_201_CREATED)


class ConversationDetail(CtxsumView):
    serializer_class = ConversationInputSerializer

    @schema.operation(
        "conversations_retrieve",
        "One conversation with its system prompt, active summary and stats",
        ConversationDetailOutputSerializer,
    )
    def get(self, request: Request, pk: str) -> Response:
        return Response(_detail(self.get_conversation()))

    @schema.operation(
        "conversations_partial_update",
        "Change the title, metadata, model, policy or system prompt",
        ConversationDetailOutputSerializer,
        request=ConversationInputSerializer,
        errors_too=schema.BODY,
    )
    def patch(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        serializer = ConversationInputSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        try:
            services.conversation_update(
                conversation=conversation, **_service_fields(serializer.validated_data)
            )
        except DjangoValidationError as error:
            raise _nest_policy_errors(error) from error
        return Response(_detail(conversation))

    @schema.operation(
        "conversations_destroy",
        "Delete a conversation with its messages and summaries",
        None,
        status=204,
    )
    def delete(self, request: Request, pk: str) -> Response:
        services.conversation_delete(conversation=self.get_conversation())
        return Response(status=status.HTTP_204_NO_CONTENT)


class MessageList(CtxsumView):
    serializer_class = MessageBatchInputSerializer
    pagination_class = TranscriptPagination

    @schema.operation(
        "messages_list",
        "The transcript: every message in seq order, archived and replaced ones too",
        MessageOutputSerializer(many=True),
    )
    def get(self, request: Request, pk: str) -> Response:
        transcript = selectors.transcript_list(conversation=self.get_conversation())
        return self.page_response(transcript, MessageOutputSerializer)

    @idempotent
    @schema.operation(
        "messages_create",
        "Append one message, or a batch (all or none)",
        AppendOutputSerializer,
        status=201,
        request=schema.MessagesAppend,
        errors_too=schema.BODY,
        description='The body is one message, or `{"messages": [...]}`. Errors name the '
        'field, and for a batch the message (`{"messages": [{}, {"role": [...]}]}`).',
    )
    def post(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        batch = isinstance(request.data, dict) and "messages" in request.data
        if batch:
            serializer = MessageBatchInputSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            messages = serializer.validated_data["messages"]
        else:
            messages = [request.data]
        try:
            appended = services.message_append(
                conversation=conversation, messages=messages, idempotency=self.idempotency
            )
        except MessagesInvalid as error:
            detail = {"messages": error.per_message} if batch else error.per_message[0]
            raise exceptions.ValidationError(detail) from error
        return Response(AppendOutputSerializer(appended).data, status=status.HTTP_201_CREATED)


class MessageRedact(CtxsumView):
    serializer_class = EmptyInputSerializer

    @schema.operation(
        "messages_redact",
        "Redact a message: its words are erased, its seq stays",
        MessageOutputSerializer,
        request=EmptyInputSerializer,
        parameters=[schema.MESSAGE_SEQ],
        errors_too=schema.BODY,
        description="The content becomes `[redacted]`; a tool call keeps its id and name but "
        "loses its arguments. Tokens and counters are recounted, and every summary covering "
        "the message becomes stale: rebuild them with `POST …/summaries/rebuild/`. "
        "Redacting a message again changes nothing.",
    )
    def post(self, request: Request, pk: str, seq: str) -> Response:
        conversation = self.get_conversation()
        _no_fields(request)
        try:
            message = services.message_redact(conversation=conversation, seq=_seq(seq))
        except Message.DoesNotExist as error:
            raise exceptions.NotFound(MESSAGE_NOT_FOUND) from error
        return Response(MessageOutputSerializer(message).data)


class ContextDetail(CtxsumView):
    serializer_class = ContextOutputSerializer

    @schema.operation(
        "context_retrieve",
        "The active context, as it would be sent to a model now",
        ContextOutputSerializer,
    )
    def get(self, request: Request, pk: str) -> Response:
        context = selectors.context_get(conversation=self.get_conversation())
        return Response(ContextOutputSerializer(context).data)


class ConversationCompact(CtxsumView):
    serializer_class = CompactInputSerializer

    @idempotent
    @schema.operation(
        "conversations_compact",
        "Compact now: summarize what the policy archives",
        CompactionOutputSerializer,
        request=CompactInputSerializer,
        errors_too=[*schema.BODY, 502],
    )
    def post(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        serializer = CompactInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            result = services.conversation_compact(
                conversation=conversation, **serializer.validated_data
            )
        except SummarizerError as error:
            # The provider's own words are in the attempt record and the log, not here.
            raise SummarizerFailed(reason=failure_reason(error)) from error
        return Response(CompactionOutputSerializer(result).data)


class SummaryRebuild(CtxsumView):
    serializer_class = EmptyInputSerializer

    @idempotent
    @schema.operation(
        "summaries_rebuild",
        "Write the active summary anew from the archived messages, under the current prompt",
        RebuildOutputSerializer,
        request=EmptyInputSerializer,
        errors_too=[*schema.BODY, 502],
        description="For a stale summary (written under another prompt, or covering a "
        "redacted message). The new version covers the same messages; the one it replaces "
        "is kept, marked superseded. `rebuilt: false` comes with a `reason`: "
        "`nothing_to_summarize` (no summary), `in_progress` or `conflict`.",
    )
    def post(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        _no_fields(request)
        try:
            rebuilt = services.conversation_rebuild(conversation=conversation)
        except SummarizerError as error:
            raise SummarizerFailed(reason=failure_reason(error)) from error
        active = selectors.context_get(conversation=conversation)
        return Response(RebuildOutputSerializer(rebuilt, context={"active": active}).data)


class SummaryList(CtxsumView):
    serializer_class = SummaryOutputSerializer

    @schema.operation(
        "summaries_list",
        "Every summary version, newest first",
        SummaryOutputSerializer(many=True),
    )
    def get(self, request: Request, pk: str) -> Response:
        summaries = selectors.summary_list(conversation=self.get_conversation())
        return self.page_response(summaries, SummaryOutputSerializer)


class ConversationChat(CtxsumView):
    serializer_class = ChatInputSerializer

    @idempotent
    @schema.operation(
        "conversations_chat",
        "One model turn: the new message and the model's reply, stored together",
        ChatOutputSerializer,
        request=ChatInputSerializer,
        errors_too=[*schema.BODY, 409, 429, 502],
        description="With `\"stream\": true` the answer is `text/event-stream`: every chunk "
        "of the model's answer as `data: {chat.completion.chunk}`, then `event: ctxsum` "
        "whose data is this operation's JSON answer, then `data: [DONE]`; a failure after "
        "the first chunk is `event: error` with `{\"detail\", \"code\"}`, and nothing is "
        "stored. A failure before it is an ordinary JSON error. A retry with the "
        "Idempotency-Key of a turn that was stored answers that turn's JSON answer (the "
        "`ctxsum` event's data, streamed or not) and calls no model.",
    )
    def post(self, request: Request, pk: str) -> Response | StreamingHttpResponse:
        conversation = self.get_conversation()
        serializer = ChatInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        fields = {k: v for k, v in serializer.validated_data.items() if v is not None}
        stream = fields.pop("stream", False)
        try:
            result = services.chat_turn(
                conversation=conversation,
                message=fields.pop("message", None),
                stream=stream,
                user=request.user,
                idempotency=self.idempotency,
                **fields,
            )
            # The first event comes before the first byte: a failure to reach the model
            # (after its retries and fallbacks) is still an ordinary JSON error.
            first = next(result) if isinstance(result, ChatStream) else None
        except MessagesInvalid as error:
            raise exceptions.ValidationError({"message": error.per_message[0]}) from error
        if isinstance(result, ChatStream):
            return event_stream(result, first, claim=self.idempotency)
        return Response(ChatOutputSerializer(result).data)

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # An EventSource asks for text/event-stream: answered as such when streaming, and
        # errors as JSON, like every other error of the API.
        if "text/event-stream" in request.META.get("HTTP_ACCEPT", ""):
            return (JSONRenderer(), JSONRenderer.media_type)
        return super().perform_content_negotiation(request, force)


def event_stream(
    stream: ChatStream, first: Any, *, claim: Claim | None = None
) -> StreamingHttpResponse:
    """The streamed turn as server-sent events (docs/architecture.md, "The chat turn"). The
    stream answers for an Idempotency-Key's ``claim`` itself: it stores the turn's answer
    once the turn is stored, and gives the key back when it ends without one."""
    events = _events(stream, first, claim)
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


def _events(stream: ChatStream, first: Any, claim: Claim | None) -> Iterator[bytes]:
    answered = False
    try:
        for event in itertools.chain([first], stream):
            if isinstance(event, ChatResult):
                answer = ChatOutputSerializer(event).data
                if claim is not None:
                    key_answer(claim, status=status.HTTP_200_OK, data=answer)
                answered = True
                yield sse(JSONRenderer().render(answer).decode(), event="ctxsum")
                yield sse("[DONE]")
            else:
                yield sse(event)
    except Exception as error:
        yield sse(_stream_error(error), event="error")
    finally:
        stream.close()
        if claim is not None and not answered:
            key_release(claim)


def _stream_error(error: Exception) -> dict[str, str]:
    """The body of a mid-stream ``event: error``: what the JSON error would have said."""
    if isinstance(error, MessagesInvalid):
        return error_body(error.per_message[0], "invalid")
    mapped = _api_exception(error)
    if isinstance(mapped, exceptions.APIException):
        return error_body(mapped.detail, str(mapped.default_code))
    logger.error("Unexpected error in a chat stream", exc_info=error)
    return error_body(ServerError.default_detail, ServerError.default_code)
