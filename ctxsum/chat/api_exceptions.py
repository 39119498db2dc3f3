"""The chat turn's errors as the HTTP errors they mean, each with a stable ``code``
(docs/api.md lists them), mapped through the core's ``api_exception``."""

from __future__ import annotations

import logging

from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions, status

from ctxsum.chat.exceptions import (
    CallLimitReached,
    ContextRedacted,
    ContextTooLong,
    ModelError,
    TurnInProgress,
)

logger = logging.getLogger("ctxsum.api")

# Each error of a chat turn: the status it answers with and its code.
ANSWERS: dict[type[Exception], tuple[int, str]] = {
    TurnInProgress: (status.HTTP_409_CONFLICT, "turn_in_progress"),
    CallLimitReached: (status.HTTP_429_TOO_MANY_REQUESTS, "call_limit_reached"),
    ContextTooLong: (status.HTTP_400_BAD_REQUEST, "context_too_long"),
    ContextRedacted: (status.HTTP_409_CONFLICT, "context_redacted"),
    ModelError: (status.HTTP_502_BAD_GATEWAY, "model_error"),
}
MODEL_FAILED = _("The model failed after its retries and fallbacks; nothing was stored.")


class ChatRefused(exceptions.APIException):
    """A chat turn's error, answered with its status and code (``ANSWERS``); a 429 names the
    limit of model calls it reached (``scope``)."""

    def __init__(self, detail: str, status_code: int, code: str, *, scope: str | None) -> None:
        super().__init__(detail, code)
        self.status_code = status_code
        self.default_code = code
        self.named = {} if scope is None else {"scope": scope}


def chat_exception(exc: Exception) -> Exception | None:
    """A chat turn's domain errors as the HTTP errors they mean; None for any other."""
    answer = next((ANSWERS[kind] for kind in ANSWERS if isinstance(exc, kind)), None)
    if answer is None:
        return None
    detail = str(exc)
    if isinstance(exc, ModelError):
        # The provider's own words go to the log, not to the client: an operational
        # event, not a bug, so no traceback.
        logger.error("Chat model error: %s", exc)
        detail = str(MODEL_FAILED)
    return ChatRefused(detail, *answer, scope=getattr(exc, "scope", None))
