"""The chat turn's errors, beside the core's (``ctxsum.exceptions``)."""

from __future__ import annotations

from ctxsum.exceptions import CtxsumError


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
