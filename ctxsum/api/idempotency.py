"""The ``Idempotency-Key`` header: ``@idempotent`` on a view method of a conversation's
endpoint (above its ``@schema.operation``) makes a retry with the same key answer what the
first request answered, without running again. A success is stored on the key; any other
answer gives the key back. See docs/architecture.md, "Idempotency keys".
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from django.http import StreamingHttpResponse
from django.http.request import RawPostDataException
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response

from ctxsum.api import schema
from ctxsum.conf import ctxsum_settings
from ctxsum.services import (
    Answer,
    Claim,
    Found,
    LeaseLost,
    fingerprint,
    key_answer,
    key_claim,
    key_release,
)

if TYPE_CHECKING:
    from ctxsum.api.base import CtxsumView

logger = logging.getLogger("ctxsum.api")

REPLAYED_HEADER = "Idempotent-Replayed"
META_NAME = "HTTP_IDEMPOTENCY_KEY"
# Visible ASCII: no spaces, no control characters, nothing a header cannot carry as sent.
KEY_FORM = re.compile(r"[!-~]{1,255}")

INVALID_KEY = _(
    "The Idempotency-Key header must be 1 to 255 visible ASCII characters (no spaces, no "
    "control characters)."
)
KEY_REUSED = _(
    "This Idempotency-Key was sent with another request (another endpoint or another body) "
    "on this conversation; use a new key for a new request."
)
KEY_IN_PROGRESS = _(
    "The request with this Idempotency-Key is still running; retry once it has answered."
)
ANSWER_LOST = _(
    "The request with this Idempotency-Key was applied, but its worker stopped before its "
    "answer was stored; it is not run again. Read the conversation to see what it stored."
)


class InvalidIdempotencyKey(exceptions.APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = INVALID_KEY
    default_code = "invalid_idempotency_key"


class IdempotencyConflict(exceptions.APIException):
    """Why a request may not run under its key now: its detail and code say which."""

    status_code = status.HTTP_409_CONFLICT


REFUSALS = {
    Found.REUSED: (KEY_REUSED, "idempotency_key_reused"),
    Found.IN_PROGRESS: (KEY_IN_PROGRESS, "idempotency_key_in_progress"),
    Found.ANSWER_LOST: (ANSWER_LOST, "idempotency_key_answer_lost"),
}


Handler = Callable[..., Response | StreamingHttpResponse]


def keep_raw_body(request: Request) -> None:
    """Read the body of a request with an Idempotency-Key before anything parses it (a
    session's CSRF check does, during authentication): its bytes are what the key's
    fingerprint hashes, and parsing consumes the stream. A body over the limit is left
    alone, for the view to refuse."""
    if META_NAME not in request.META:
        return
    chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
    size = int(request.META.get("CONTENT_LENGTH") or 0)
    if not chunked and size <= ctxsum_settings.MAX_BODY_BYTES:
        request._request.body  # noqa: B018  (Django keeps it, and parses from the copy)


def _raw_body(request: Request) -> bytes:
    try:
        return request._request.body
    except RawPostDataException:
        # Something read the stream before keep_raw_body could (a middleware of the
        # project's): the parsed body, in a canonical form, stands for the bytes.
        return json.dumps(request.data, sort_keys=True, separators=(",", ":")).encode()


def answer_store(claim: Claim, response: Response) -> None:
    """Store a success on its key. A store that fails (the database went after the write)
    is logged, never answered: the write stands and its answer goes out; retries find the
    key in progress, then its answer lost, and never run the write again."""
    try:
        key_answer(claim, status=response.status_code, data=response.data)
    except Exception:
        logger.exception("The answer to Idempotency-Key claim %s could not be stored.", claim.pk)


def idempotent(handler: Handler) -> Handler:
    """Honour ``Idempotency-Key`` on a view method of an endpoint about one conversation,
    and describe the header and its 409 answers in the schema. Put it above
    ``@schema.operation``."""

    @wraps(handler)
    def answer(
        view: CtxsumView, request: Request, *args: Any, **kwargs: Any
    ) -> Response | StreamingHttpResponse:
        key: str | None = request.META.get(META_NAME)
        if key is None:
            return handler(view, request, *args, **kwargs)
        # Under WSGI a header's bytes arrive as Latin-1 text: anything past ASCII fails here.
        if not KEY_FORM.fullmatch(key):
            raise InvalidIdempotencyKey
        body = _raw_body(request)
        operation = f"{request.method} {type(view).__name__}"
        found = key_claim(
            owner=request.user,
            conversation=view.get_conversation(),
            key=key,
            operation=operation,
            fingerprint=fingerprint(request.method or "", operation, body),
        )
        if isinstance(found, Answer):
            return Response(found.data, status=found.status, headers={REPLAYED_HEADER: "true"})
        if isinstance(found, Found):
            raise IdempotencyConflict(*REFUSALS[found])
        view.idempotency = found
        try:
            response = handler(view, request, *args, **kwargs)
        except LeaseLost as error:
            # An abandoned claim was taken over by a retry: that one runs, this one stops.
            raise IdempotencyConflict(*REFUSALS[Found.IN_PROGRESS]) from error
        except BaseException:
            key_release(found)
            raise
        finally:
            view.idempotency = None
        if isinstance(response, StreamingHttpResponse):
            return response  # the stream stores its answer, or gives the key back, itself
        if status.is_success(response.status_code):
            answer_store(found, response)
        else:
            key_release(found)
        return response

    described: Handler = schema.idempotent(answer)
    return described
