"""REST endpoints: parse the request, call one service or selector, shape the answer."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from rest_framework import exceptions, status
from rest_framework.generics import GenericAPIView
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from ctxsum import selectors, services
from ctxsum.api.serializers import (
    POLICY_KEYS,
    CompactSerializer,
    ConversationCreateSerializer,
    ConversationSerializer,
    ConversationWriteSerializer,
    message_data,
    summary_data,
)
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import MessagesInvalid, SummarizerError, TooLarge
from ctxsum.models import Conversation
from ctxsum.policy import Reason
from ctxsum.services.compaction import CompactionResult, conversation_compact, failure_reason

CONVERSATION_NOT_FOUND = "No such conversation."
BODY_TOO_LARGE = "The request body is {size} bytes; the limit is {limit} bytes."
TOO_DEEP = "The JSON is nested too deeply."


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request is too large."
    default_code = "too_large"


class SummarizerFailed(exceptions.APIException):
    status_code = status.HTTP_502_BAD_GATEWAY
    default_detail = "The summarizer failed; nothing was changed."
    default_code = "summarizer_error"

    def __init__(self, detail: str, *, reason: Reason) -> None:
        super().__init__(detail)
        self.reason = reason


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class CtxsumView(GenericAPIView):
    """Shared behaviour: owner-scoped lookups, body limits, domain errors as HTTP errors."""

    pagination_class = Pagination
    # Every endpoint needs a user, whatever the project's DRF defaults say.
    permission_classes = [IsAuthenticated]

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Any:
        # Services own their transactions: compaction must call the LLM outside of one and
        # an auto compaction must follow a committed append, so ATOMIC_REQUESTS is opted out.
        return transaction.non_atomic_requests(super().as_view(**initkwargs))

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        limit = ctxsum_settings.MAX_BODY_BYTES
        size = int(request.META.get("CONTENT_LENGTH") or 0)
        if size > limit:
            raise PayloadTooLarge(BODY_TOO_LARGE.format(size=size, limit=limit))

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, TooLarge | RequestDataTooBig):
            exc = PayloadTooLarge(str(exc))
        elif isinstance(exc, RecursionError):
            # JSON nested deeper than Python's parser or encoder can follow: bad input.
            exc = exceptions.ParseError(TOO_DEEP)
        elif isinstance(exc, Conversation.DoesNotExist):
            # Deleted by another request between the lookup and the service's locked re-read.
            exc = exceptions.NotFound(CONVERSATION_NOT_FOUND)
        elif isinstance(exc, DjangoValidationError):
            exc = exceptions.ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else exc.messages
            )
        response = super().handle_exception(exc)
        if isinstance(exc, PayloadTooLarge | SummarizerFailed):
            response.data = {"detail": str(exc.detail), "code": exc.default_code}
        if isinstance(exc, SummarizerFailed):
            # summarizer_error, or summary_truncated for an answer cut off at its limit.
            response.data["reason"] = str(exc.reason)
        return response

    def get_conversation(self) -> Conversation:
        # Someone else's conversation, a missing one and a malformed id answer alike.
        try:
            return Conversation.objects.get(pk=self.kwargs["pk"], owner=self.request.user)
        except (Conversation.DoesNotExist, DjangoValidationError, ValueError) as error:
            raise exceptions.NotFound(CONVERSATION_NOT_FOUND) from error


def _nest_policy_errors(error: DjangoValidationError) -> exceptions.ValidationError:
    """The service names ``trigger``/``keep``/…; over REST they live under ``policy``."""
    errors = dict(error.message_dict)
    nested = {key: errors.pop(key) for key in POLICY_KEYS if key in errors}
    if nested:
        errors["policy"] = nested
    return exceptions.ValidationError(errors)


def _policy_fields(data: dict[str, Any]) -> dict[str, Any]:
    policy = data.pop("policy", None) or {}
    return {key: policy[key] for key in POLICY_KEYS if key in policy}


class ApiRoot(CtxsumView):
    def get(self, request: Request) -> Response:
        return Response({"conversations": reverse("ctxsum:conversation-list", request=request)})


class ConversationList(CtxsumView):
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(selectors.conversation_list(owner=request.user))
        return self.get_paginated_response(ConversationSerializer(page, many=True).data)

    def post(self, request: Request) -> Response:
        serializer = ConversationCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        try:
            conversation = services.conversation_create(
                owner=request.user, **_policy_fields(data), **data
            )
        except MessagesInvalid as error:
            raise exceptions.ValidationError({"messages": error.per_message}) from error
        except DjangoValidationError as error:
            raise _nest_policy_errors(error) from error
        return Response(conversation_detail(conversation), status=status.HTTP_201_CREATED)


def conversation_detail(conversation: Conversation) -> dict[str, Any]:
    context = selectors.context_get(conversation=conversation)
    data = dict(ConversationSerializer(conversation).data)
    leading = context.rows[0] if context.leading else None
    data["system"] = leading.content if leading else None
    data["summary"] = summary_data(context.summary)
    data["stats"] = selectors.conversation_stats(conversation=conversation)
    return data


class ConversationDetail(CtxsumView):
    def get(self, request: Request, pk: str) -> Response:
        return Response(conversation_detail(self.get_conversation()))

    def patch(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        serializer = ConversationWriteSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        try:
            conversation = services.conversation_update(
                conversation=conversation, **_policy_fields(data), **data
            )
        except DjangoValidationError as error:
            raise _nest_policy_errors(error) from error
        return Response(conversation_detail(conversation))

    def delete(self, request: Request, pk: str) -> Response:
        services.conversation_delete(conversation=self.get_conversation())
        return Response(status=status.HTTP_204_NO_CONTENT)


class MessageList(CtxsumView):
    def get(self, request: Request, pk: str) -> Response:
        transcript = selectors.transcript_list(conversation=self.get_conversation())
        page = self.paginate_queryset(transcript)
        return self.get_paginated_response([message_data(message) for message in page])

    def post(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        body = request.data
        batch = isinstance(body, dict) and "messages" in body
        if batch and set(body) != {"messages"}:
            unknown = sorted(set(body) - {"messages"})
            raise exceptions.ValidationError({field: ["Unknown field."] for field in unknown})
        try:
            appended = services.message_append(
                conversation=conversation, messages=body["messages"] if batch else [body]
            )
        except MessagesInvalid as error:
            detail = {"messages": error.per_message} if batch else error.per_message[0]
            raise exceptions.ValidationError(detail) from error
        data: dict[str, Any] = {"messages": [message_data(row) for row in appended.messages]}
        if appended.compaction is not None:
            data["compaction"] = asdict(appended.compaction)
        return Response(data, status=status.HTTP_201_CREATED)


class ContextDetail(CtxsumView):
    def get(self, request: Request, pk: str) -> Response:
        context = selectors.context_get(conversation=self.get_conversation())
        return Response(context_data(context))


def context_data(context: selectors.ActiveContext) -> dict[str, Any]:
    return {
        "messages": context.messages,
        "token_count": context.token_count,
        "summary": summary_data(context.summary),
        "revision": context.revision,
        "over_max_context_tokens": context.over_max_context_tokens,
    }


class ConversationCompact(CtxsumView):
    def post(self, request: Request, pk: str) -> Response:
        conversation = self.get_conversation()
        serializer = CompactSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            result = conversation_compact(conversation=conversation, **serializer.validated_data)
        except SummarizerError as error:
            raise SummarizerFailed(
                f"{SummarizerFailed.default_detail} {error}", reason=failure_reason(error)
            ) from error
        return Response(compaction_data(result))


def compaction_data(result: CompactionResult) -> dict[str, Any]:
    data: dict[str, Any] = {
        "compacted": result.compacted,
        "reason": str(result.reason),
        "over_trigger": result.over_trigger,
        "summary": summary_data(result.summary),
        "context": context_data(result.context),
    }
    plan = result.plan
    if plan is not None and result.reason != Reason.BELOW_TRIGGER:
        archived = result.archived or []
        data["plan"] = {
            "archive": {
                "count": len(archived),
                "from_seq": archived[0].seq if archived else None,
                "to_seq": archived[-1].seq if archived else None,
            },
            "keep_count": plan.message_count_before - plan.cutoff,
            "tokens_before": plan.tokens_before,
            "tokens_after": plan.tokens_after,
        }
    return data


class SummaryList(CtxsumView):
    def get(self, request: Request, pk: str) -> Response:
        page = self.paginate_queryset(selectors.summary_list(conversation=self.get_conversation()))
        return self.get_paginated_response([summary_data(summary) for summary in page])
