"""REST endpoints: parse the request, call one service or selector, shape the answer."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.shortcuts import get_object_or_404
from rest_framework import exceptions, status
from rest_framework.generics import GenericAPIView
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from ctxsum import selectors, services
from ctxsum.api.serializers import (
    ConversationCreateSerializer,
    ConversationSerializer,
    ConversationWriteSerializer,
    message_data,
    summary_data,
)
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import MessagesInvalid, TooLarge
from ctxsum.models import Conversation

BODY_TOO_LARGE = "The request body is {size} bytes; the limit is {limit} bytes."


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request is too large."
    default_code = "too_large"


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class CtxsumView(GenericAPIView):
    """Shared behaviour: owner-scoped lookups, body limits, domain errors as HTTP errors."""

    pagination_class = Pagination

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        limit = ctxsum_settings.MAX_BODY_BYTES
        size = int(request.META.get("CONTENT_LENGTH") or 0)
        if size > limit:
            raise PayloadTooLarge(BODY_TOO_LARGE.format(size=size, limit=limit))

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, TooLarge):
            exc = PayloadTooLarge(str(exc))
        elif isinstance(exc, RequestDataTooBig):
            exc = PayloadTooLarge(str(exc))
        elif isinstance(exc, DjangoValidationError):
            exc = exceptions.ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else exc.messages
            )
        response = super().handle_exception(exc)
        if isinstance(exc, PayloadTooLarge):
            response.data = {"detail": str(exc.detail), "code": exc.default_code}
        return response

    def get_conversation(self) -> Conversation:
        return get_object_or_404(Conversation, pk=self.kwargs["pk"], owner=self.request.user)


def _nest_policy_errors(error: DjangoValidationError) -> exceptions.ValidationError:
    """The service names ``trigger``/``keep``; over REST they live under ``policy``."""
    errors = dict(error.message_dict)
    nested = {key: errors.pop(key) for key in ("trigger", "keep") if key in errors}
    if nested:
        errors["policy"] = nested
    return exceptions.ValidationError(errors)


def _policy_fields(data: dict[str, Any]) -> dict[str, Any]:
    policy = data.pop("policy", None) or {}
    return {key: policy[key] for key in ("trigger", "keep") if key in policy}


class ApiRoot(CtxsumView):
    def get(self, request: Request) -> Response:
        return Response(
            {"conversations": reverse("ctxsum:conversation-list", request=request)}
        )


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
            rows = services.message_append(
                conversation=conversation, messages=body["messages"] if batch else [body]
            )
        except MessagesInvalid as error:
            detail = {"messages": error.per_message} if batch else error.per_message[0]
            raise exceptions.ValidationError(detail) from error
        data = {"messages": [message_data(row) for row in rows]}
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
    }
