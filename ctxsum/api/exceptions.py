"""The API's errors: each domain error of ctxsum as the HTTP error it means, with a stable
``code`` (docs/api.md lists them)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DatabaseError, router
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions, status

from ctxsum.exceptions import FailureCause, SummarizerError, TooLarge
from ctxsum.migration_state import unapplied_migrations
from ctxsum.models import Conversation
from ctxsum.policy import Reason, failure_reason

logger = logging.getLogger("ctxsum.api")

CONVERSATION_NOT_FOUND = _("No such conversation.")
SUMMARY_CUT_OFF = _(
    "The summary was cut off at SUMMARY_MAX_TOKENS, so it was not stored; nothing was changed."
)
TOO_DEEP = _("The JSON is nested too deeply.")
MIGRATIONS_UNAPPLIED = _(
    "ctxsum's tables are not all there: {count} migration(s) not applied ({names}). "
    "Run `python manage.py migrate`."
)


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = _("The request is too large.")
    default_code = "too_large"


class LengthRequired(exceptions.APIException):
    status_code = status.HTTP_411_LENGTH_REQUIRED
    default_detail = _("Send the request body with a Content-Length, not chunked.")
    default_code = "length_required"


class MigrationsUnapplied(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = _("ctxsum's migrations are not applied.")
    default_code = "migrations_unapplied"

    def __init__(self, names: list[str]) -> None:
        shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
        super().__init__(MIGRATIONS_UNAPPLIED.format(count=len(names), names=shown))
        self.named = {"migrations": names}


# What the client reads of a summarizer failure, by its cause: never the provider's text
# (it may quote the request, or name the account); the log and the attempt keep it.
CAUSE_DETAILS = {
    FailureCause.UNAUTHORIZED: _(
        "The summarizer refused ctxsum's credentials (check SUMMARIZER_OPTIONS' api_key); "
        "nothing was changed."
    ),
    FailureCause.UNREACHABLE: _("The summarizer could not be reached; nothing was changed."),
    FailureCause.TIMEOUT: _("The summarizer did not answer in time; nothing was changed."),
    FailureCause.RATE_LIMITED: _(
        "The summarizer is rate limiting ctxsum; nothing was changed. Try again later."
    ),
    FailureCause.BAD_ANSWER: _(
        "The summarizer's answer was not a usable summary; nothing was changed."
    ),
    FailureCause.PROVIDER_ERROR: _("The summarizer answered with an error; nothing was changed."),
}


class SummarizerFailed(exceptions.APIException):
    status_code = status.HTTP_502_BAD_GATEWAY
    default_detail = _("The summarizer failed; nothing was changed.")
    default_code = "summarizer_error"

    def __init__(self, *, reason: Reason, cause: FailureCause) -> None:
        truncated = reason == Reason.SUMMARY_TRUNCATED
        super().__init__(SUMMARY_CUT_OFF if truncated else CAUSE_DETAILS.get(cause))
        # summarizer_error, or summary_truncated for an answer cut off at its limit; and why.
        self.named = {"reason": str(reason), "cause": str(cause)}


# An installed app's domain errors as the HTTP errors they mean: a function per app, which
# answers None for an error that is not its own (``map_app_errors``).
ErrorMapping = Callable[[Exception], Exception | None]
_app_errors: dict[str, ErrorMapping] = {}


def map_app_errors(name: str, mapping: ErrorMapping) -> None:
    """Register ``mapping`` for the errors of the app ``name`` (from its ``AppConfig.ready()``;
    registering again replaces). ``api_exception`` asks it after the core's own errors."""
    _app_errors[name] = mapping


def _unapplied() -> list[str]:
    """The migrations of ctxsum not applied to the database its conversations are in."""
    return unapplied_migrations(router.db_for_write(Conversation))


def api_exception(exc: Exception) -> Exception:
    """Domain errors as the HTTP errors they mean: the core's, then each installed app's."""
    if isinstance(exc, SummarizerError):
        return SummarizerFailed(reason=failure_reason(exc), cause=exc.kind)
    if isinstance(exc, TooLarge | RequestDataTooBig):
        return PayloadTooLarge(str(exc))
    if isinstance(exc, RecursionError):
        # JSON nested deeper than Python's parser or encoder can follow: bad input.
        return exceptions.ParseError(TOO_DEEP)
    if isinstance(exc, DatabaseError) and (missing := _unapplied()):
        # A table that is not there yet: the project has not run migrate since installing
        # (or upgrading) ctxsum. Logged with the error the database gave.
        logger.error("ctxsum's migrations are not applied: %s", ", ".join(missing), exc_info=exc)
        return MigrationsUnapplied(missing)
    if isinstance(exc, Conversation.DoesNotExist):
        # Deleted by another request between the lookup and the service's locked re-read.
        return exceptions.NotFound(CONVERSATION_NOT_FOUND)
    for mapping in _app_errors.values():
        if (mapped := mapping(exc)) is not None:
            return mapped
    if isinstance(exc, DjangoValidationError):
        return exceptions.ValidationError(coded_messages(exc))
    return exc


def coded_messages(error: DjangoValidationError) -> Any:
    """Django's ValidationError as DRF's detail: its messages by field (or a list), each
    with its code (``invalid`` when it has none)."""

    def coded(errors: list[DjangoValidationError]) -> list[exceptions.ErrorDetail]:
        return [
            exceptions.ErrorDetail(
                message, code=each.code or getattr(each.message, "code", None) or "invalid"
            )
            for each in errors
            for message in each.messages
        ]

    if hasattr(error, "error_dict"):
        return {field: coded(errors) for field, errors in error.error_dict.items()}
    return coded(error.error_list)
