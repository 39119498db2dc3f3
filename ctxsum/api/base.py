"""The base of ctxsum's views: owner-scoped lookups, JSON bodies within their limits,
services' own transactions, and every error as JSON with its code."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.exceptions import PermissionDenied
from django.db import connections, transaction
from django.db.models import QuerySet
from django.http import Http404
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions, views
from rest_framework.generics import GenericAPIView
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer

from ctxsum.api import access, paths
from ctxsum.api.errors import ServerError, error_body, invalid_body
from ctxsum.api.exceptions import (
    CONVERSATION_NOT_FOUND,
    LengthRequired,
    PayloadTooLarge,
    api_exception,
)
from ctxsum.api.idempotency import keep_raw_body
from ctxsum.api.pagination import Pagination
from ctxsum.conf import ctxsum_settings
from ctxsum.models import Conversation
from ctxsum.services import Claim

logger = logging.getLogger("ctxsum.api")
T = TypeVar("T")

MESSAGE_NOT_FOUND = _("No such message in this conversation.")
SUMMARY_NOT_FOUND = _("No such summary version in this conversation.")
SUBJECT_NOT_FOUND = _(
    "No subject has this name: a subject is 1 to 200 characters, with no slash, no control "
    "character and no whitespace at either end, and is not “.” or “..”."
)
BODY_TOO_LARGE = _("The request body is {size} bytes; the limit is {limit} bytes.")


class CtxsumView(GenericAPIView[Any]):
    """Shared behaviour: owner-scoped lookups, body limits, domain errors as HTTP errors."""

    pagination_class = Pagination
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

    def get_permissions(self) -> list[BasePermission]:
        # API_PERMISSION_CLASSES (by default, a logged-in user), whatever the project's DRF
        # defaults say.
        return access.permissions()

    def get_exception_handler(self) -> Callable[..., Response | None]:
        # DRF's own, whatever the project's EXCEPTION_HANDLER: ctxsum's errors keep their
        # shape (``handle_exception`` below) in any project.
        return views.exception_handler

    def handle_exception(self, exc: Exception) -> Response:
        exc = api_exception(exc)
        if not isinstance(exc, exceptions.APIException | Http404 | PermissionDenied):
            logger.error(
                "Unexpected error answering %s %s",
                self.request.method,
                self.request.path,
                exc_info=exc,
            )
            exc = ServerError()
        response = super().handle_exception(exc)
        if isinstance(exc, exceptions.ValidationError):
            response.data = invalid_body(exc.detail)
            return response
        if not isinstance(response.data, dict):
            return response
        # Every other error: its detail and a stable code.
        detail = response.data.get("detail", "")
        code = getattr(detail, "code", None) or getattr(exc, "default_code", "error")
        response.data = {**response.data, **error_body(detail, str(code))}
        # What else an error names: a summarizer's ``reason``, a limit's ``scope``, …
        response.data.update(getattr(exc, "named", {}))
        return response

    def validated(self, serializer: type[Serializer[Any]], **kwargs: Any) -> Any:
        """The request's body as ``serializer`` validates it; a 400 when it does not."""
        checked = serializer(data=self.request.data, **kwargs)
        checked.is_valid(raise_exception=True)
        return checked.validated_data

    def page_response(self, rows: QuerySet[Any], output: type[Serializer[Any]]) -> Response:
        """The requested page of ``rows``, each shaped by ``output``."""
        return self.get_paginated_response(output(self.paginate_queryset(rows), many=True).data)

    def get_queryset(self) -> QuerySet[Conversation]:
        """The conversations the request can reach (API_CONVERSATIONS; by default, those
        its user owns): all an endpoint can reach."""
        return access.conversations(self.request)

    def get_conversation(self) -> Conversation:
        """The conversation the path names, looked up once per request."""
        if self._conversation is None:
            # Someone else's conversation, a missing one and a malformed id answer alike (an
            # id in canonical form is a valid UUID: the query cannot fail on it).
            pk = paths.ConversationId.parse(self.kwargs["pk"])
            if pk is None:
                raise exceptions.NotFound(CONVERSATION_NOT_FOUND)
            try:
                self._conversation = self.get_queryset().get(pk=pk)
            except Conversation.DoesNotExist as error:
                raise exceptions.NotFound(CONVERSATION_NOT_FOUND) from error
            # API_PERMISSION_CLASSES' word on this conversation: a 403 when it refuses.
            self.check_object_permissions(self.request, self._conversation)
        return self._conversation


def from_path(parse: Callable[[str], T | None], missing: Any) -> Callable[[str], T]:
    """A reader of a path segment: what the segment names, else a 404 with ``missing``,
    like a missing row, before any query."""

    def read(value: str) -> T:
        parsed = parse(value)
        if parsed is None:
            raise exceptions.NotFound(missing)
        return parsed

    return read


seq_from_path = from_path(paths.Seq.parse, MESSAGE_NOT_FOUND)
version_from_path = from_path(paths.Version.parse, SUMMARY_NOT_FOUND)
subject_from_path = from_path(paths.Subject.parse, SUBJECT_NOT_FOUND)
