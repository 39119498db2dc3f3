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


class ChatError(CtxsumError):
    """A chat turn could not be made; nothing of it was stored and its reservation (if it
    had one) was given back."""


class CallLimitReached(ChatError):
    """The conversation's, or the user's daily, allowance of model calls is used up.
    ``scope`` says which: ``"conversation"`` or ``"user_day"``."""

    def __init__(self, message: str, *, scope: str) -> None:
        super().__init__(message)
        self.scope = scope


class TurnInProgress(ChatError):
    """Another turn of the same conversation is running (its turn lock is live)."""


class ContextRedacted(ChatError):
    """A message the model was sent was redacted during its call: its reply, which may
    quote it, is not stored (docs/architecture.md, invariant f)."""


class ContextTooLong(ChatError):
    """The context, with the new message, is over MAX_CONTEXT_TOKENS even after compaction."""


class ModelError(ChatError):
    """The chat model failed: after the retries and every fallback model, or mid-stream.

    ``transient`` tells whether another try could succeed (429, 5xx, timeout, connection);
    ``status`` is the HTTP status when there was one; ``cause`` the original exception.
    """

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        status: int | None = None,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status
        self.cause = cause
