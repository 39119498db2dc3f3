"""The chat turn's errors as the HTTP errors they mean, each with a stable ``code``
(docs/api.md lists them), mapped through the core's ``api_exception`` (ChatConfig.ready
registers ``chat_exception`` with ``map_app_errors``)."""

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


class TurnConflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = _("Another turn of this conversation is in progress.")
    default_code = "turn_in_progress"


class ContextRedactedConflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = _("A message the model was sent was redacted during its call.")
    default_code = "context_redacted"


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


def chat_exception(exc: Exception) -> Exception | None:
    """A chat turn's domain errors as the HTTP errors they mean; None for any other."""
    if isinstance(exc, TurnInProgress):
        return TurnConflict(str(exc))
    if isinstance(exc, CallLimitReached):
        return CallLimit(str(exc), scope=exc.scope)
    if isinstance(exc, ContextTooLong):
        return ContextTooLongError(str(exc))
    if isinstance(exc, ContextRedacted):
        return ContextRedactedConflict(str(exc))
    if isinstance(exc, ModelError):
        # The provider's own words go to the log, not to the client: an operational
        # event, not a bug, so no traceback.
        logger.error("Chat model error: %s", exc)
        return ModelFailed()
    return None
