"""ctxsum's errors: one base class and a few precise subclasses."""

from __future__ import annotations

from enum import StrEnum

from django.core.exceptions import ValidationError


class CtxsumError(Exception):
    """Base class of every ctxsum error."""


class FailureCause(StrEnum):
    """Why a summarizer call failed, in words a client can act on (the API's ``cause``),
    never the provider's own text."""

    UNAUTHORIZED = "unauthorized"  # the provider refused the credentials (401, 403)
    UNREACHABLE = "unreachable"  # no connection to the provider
    TIMEOUT = "timeout"  # no answer within SUMMARY_TIMEOUT
    RATE_LIMITED = "rate_limited"  # the provider asked to slow down (429)
    BAD_ANSWER = "bad_answer"  # an answer that is no usable summary (malformed, blank, cut off)
    PROVIDER_ERROR = "provider_error"  # any other error status of the provider
    FAILED = "failed"  # anything else (a backend that does not say)


class SummarizerError(CtxsumError):
    """The summarizer failed (HTTP error, timeout, malformed or blank answer); ``cause``
    keeps the original exception, if there was one, and ``kind`` says why in one of
    ``FailureCause``."""

    default_kind = FailureCause.FAILED

    def __init__(
        self,
        message: str,
        *,
        cause: BaseException | None = None,
        kind: FailureCause | None = None,
    ) -> None:
        super().__init__(message)
        self.cause = cause
        self.kind = kind or self.default_kind


class SummaryTruncated(SummarizerError):
    """The summarizer's answer was cut off at its token limit: an incomplete summary."""

    default_kind = FailureCause.BAD_ANSWER


class Problem(str):
    """The words of one error about a field, and the stable code a program reads: the REST
    API answers it as the error's ``code`` (``required``, ``unknown_field``, …)."""

    code: str

    def __new__(cls, words: object, code: str = "invalid") -> Problem:
        problem = super().__new__(cls, str(words))
        problem.code = code
        return problem


class TooLarge(CtxsumError):
    """A message, batch or request body is over its configured limit."""


class MessagesInvalid(ValidationError):
    """Some messages of a batch are invalid. ``per_message`` holds one dict of field errors
    per message ({} for a valid one); the message dict names ``messages[i].field``."""

    def __init__(self, per_message: list[dict[str, list[str]]]) -> None:
        self.per_message = per_message
        super().__init__(
            {
                f"messages[{index}].{field}": errors
                for index, fields in enumerate(per_message)
                for field, errors in fields.items()
            }
        )
