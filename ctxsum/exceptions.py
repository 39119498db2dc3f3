"""ctxsum's errors: one base class and a few precise subclasses."""

from __future__ import annotations

from django.core.exceptions import ValidationError


class CtxsumError(Exception):
    """Base class of every ctxsum error."""


class SummarizerError(CtxsumError):
    """The summarizer failed (HTTP error, timeout, malformed or blank answer); ``cause``
    keeps the original exception, if there was one."""

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class SummaryTruncated(SummarizerError):
    """The summarizer's answer was cut off at its token limit: an incomplete summary."""


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
