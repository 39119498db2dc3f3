"""The chat turn: one model call on a conversation's active context, stored with the message
it answers. Its steps (check, reserve, compact, ceiling, model call, commit) are in
docs/architecture.md, "The chat turn": any failure after the reservation gives it back and
stores nothing; once the commit is done the turn is a success, and what follows it (the
``messages_appended`` signal) is logged when it fails, never raised.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from contextlib import aclosing
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Literal, overload

from django.db import transaction

from ctxsum.chat import client
from ctxsum.chat.completions import (
    NOTHING_TO_ANSWER,
    UNANSWERED,
    ReplyBuilder,
    Usage,
    options_clean,
    turn_message_clean,
    unanswered_calls,
)
from ctxsum.chat.exceptions import ContextRedacted, ContextTooLong, ModelError, TurnInProgress
from ctxsum.chat.model_calls import (
    Attempts,
    acall_model,
    astream_model,
    call_model,
    model_chain,
    reply_clean,
    stream_model,
)
from ctxsum.chat.models import ChatTurn
from ctxsum.chat.turns import TURN, Reservation, turn_lock, turn_release, turn_reserve
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import MessagesInvalid
from ctxsum.models import Conversation, Message, Summary, single
from ctxsum.selectors import ActiveContext, context_get, conversation_policy
from ctxsum.services.autocompact import AutoCompaction, autocompact_schedule
from ctxsum.services.compaction import (
    CompactionResult,
    aconversation_compact,
    conversation_compact,
    signal_after_commit,
)
from ctxsum.services.idempotency import Claim, key_applied
from ctxsum.services.messages import messages_count, messages_insert, tool_results_check
from ctxsum.services.row_lease import LeaseLost
from ctxsum.services.transactions import write_db
from ctxsum.threads import database_sync_to_async

# The Python API of the chat turn (docs/guide/python-api.md).
__all__ = ["ChatResult", "ChatStream", "achat_turn", "chat_turn"]

CONTEXT_REDACTED = (
    "A message the model was sent was redacted during its call; its reply was not stored. "
    "Send the turn again."
)
CONTEXT_TOO_LONG = (
    "The context with the new message is {tokens} tokens, over this conversation's "
    "max_context_tokens ({limit}), even after compaction."
)
TURN_TAKEN_OVER = (
    "The turn ran longer than CHAT_TURN_SECONDS and another turn took the conversation "
    "over; nothing was stored."
)


@dataclass(kw_only=True)
class ChatResult:
    """What a turn stored: the new message (when there was one) and the reply, the turn's
    record (model, attempts, usage), and what the compaction before the call did (None when
    none was due)."""

    conversation: Conversation
    messages: list[Message]
    turn: ChatTurn
    compaction: AutoCompaction | None = None


# What a streamed turn yields: a chunk of the model's answer, then the stored result.
Event = dict[str, Any] | ChatResult


@dataclass(kw_only=True)
class _Turn:
    """A reserved turn, ready for its model call."""

    caller: Conversation  # the instance chat_turn was given, updated at the end
    conversation: Conversation  # its row as read once reserved: what the turn plans from
    reservation: Reservation
    message: dict[str, Any] | None
    request: list[dict[str, Any]]  # what the model is sent
    sent: ActiveContext  # the stored context the request holds
    options: dict[str, Any]
    attempts: Attempts
    user: Any
    compaction: AutoCompaction | None
    idempotency: Claim | None


@overload
def chat_turn(
    *,
    conversation: Conversation,
    message: dict[str, Any] | None,
    model: str | None = ...,
    tools: list[dict[str, Any]] | None = ...,
    tool_choice: Any = ...,
    temperature: float | None = ...,
    max_completion_tokens: int | None = ...,
    stream: Literal[False] = ...,
    user: Any = ...,
    idempotency: Claim | None = ...,
) -> ChatResult: ...


@overload
def chat_turn(
    *,
    conversation: Conversation,
    message: dict[str, Any] | None,
    model: str | None = ...,
    tools: list[dict[str, Any]] | None = ...,
    tool_choice: Any = ...,
    temperature: float | None = ...,
    max_completion_tokens: int | None = ...,
    stream: Literal[True],
    user: Any = ...,
    idempotency: Claim | None = ...,
) -> ChatStream: ...


def chat_turn(
    *,
    conversation: Conversation,
    message: dict[str, Any] | None,
    model: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    temperature: float | None = None,
    max_completion_tokens: int | None = None,
    stream: bool = False,
    user: Any = None,
    idempotency: Claim | None = None,
) -> ChatResult | ChatStream:
    """One model turn on ``conversation``: ``message`` (a user message or a tool result; None
    continues after results appended through ``message_append``) and the model's reply.

    Without ``stream``: returns the stored result. With it: returns a ChatStream, which the
    reservation and any compaction have happened for, and whose iteration calls the model
    (iterate it to the end, or close it). ``user`` is who asks (counted against
    CHAT_MAX_CALLS_PER_USER_PER_DAY; the conversation's owner when None). With
    ``idempotency`` (an Idempotency-Key's claim), the claim is marked applied in the
    transaction that stores the turn: a retry with that key never stores it again. The turn
    plans from the conversation's row as read once it is reserved (trigger, ceiling, model),
    not from ``conversation``, which is brought up to date when the turn is stored.

    Raises ValidationError / MessagesInvalid (bad options or message; nothing happened),
    TurnInProgress, CallLimitReached, SummarizerError (the compaction failed),
    ContextTooLong, ModelError or Conversation.DoesNotExist; after the reservation, every one
    of them gives it back and stores nothing.
    """
    options = {
        "model": model,
        "tools": tools,
        "tool_choice": tool_choice,
        "temperature": temperature,
        "max_completion_tokens": max_completion_tokens,
    }
    ask = _asked(conversation, message, options, user, idempotency)
    try:
        planned = _planned(ask)
        result = None
        if planned.incoming is not None:
            result = conversation_compact(
                conversation=planned.conversation, force=True, incoming=planned.incoming
            )
        turn = _ready(ask, planned, result)
        if stream:
            return ChatStream(turn)
        completion, reply = call_model(turn.attempts, turn.request, turn.options)
        return _commit(turn, reply, completion.usage, completion.finish_reason, streamed=False)
    except BaseException:
        turn_release(ask.reservation)
        raise


@overload
async def achat_turn(
    *,
    conversation: Conversation,
    message: dict[str, Any] | None,
    model: str | None = ...,
    tools: list[dict[str, Any]] | None = ...,
    tool_choice: Any = ...,
    temperature: float | None = ...,
    max_completion_tokens: int | None = ...,
    stream: Literal[False] = ...,
    user: Any = ...,
    idempotency: Claim | None = ...,
) -> ChatResult: ...


@overload
async def achat_turn(
    *,
    conversation: Conversation,
    message: dict[str, Any] | None,
    model: str | None = ...,
    tools: list[dict[str, Any]] | None = ...,
    tool_choice: Any = ...,
    temperature: float | None = ...,
    max_completion_tokens: int | None = ...,
    stream: Literal[True],
    user: Any = ...,
    idempotency: Claim | None = ...,
) -> ChatStream: ...


async def achat_turn(
    *,
    conversation: Conversation,
    message: dict[str, Any] | None,
    model: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    temperature: float | None = None,
    max_completion_tokens: int | None = None,
    stream: bool = False,
    user: Any = None,
    idempotency: Claim | None = None,
) -> ChatResult | ChatStream:
    """``chat_turn`` for async code: the same checks, reservation, plan and commit, each
    in the thread that serves the database, with the compaction before the call
    (``aconversation_compact``) and the model call through ``openai.AsyncOpenAI`` awaited
    between them, no connection in use. A stream is iterated with ``async for`` (and
    closed with ``aclose()``)."""
    options = {
        "model": model,
        "tools": tools,
        "tool_choice": tool_choice,
        "temperature": temperature,
        "max_completion_tokens": max_completion_tokens,
    }
    ask = await database_sync_to_async(_asked)(conversation, message, options, user, idempotency)
    try:
        planned = await database_sync_to_async(_planned)(ask)
        result = None
        if planned.incoming is not None:
            result = await aconversation_compact(
                conversation=planned.conversation, force=True, incoming=planned.incoming
            )
        turn = await database_sync_to_async(_ready)(ask, planned, result)
        if stream:
            return ChatStream(turn)
        completion, reply = await acall_model(turn.attempts, turn.request, turn.options)
        return await database_sync_to_async(_commit)(
            turn, reply, completion.usage, completion.finish_reason, streamed=False
        )
    except BaseException:
        await database_sync_to_async(turn_release)(ask.reservation)
        raise


def _message_check(conversation: Conversation, message: Any) -> dict[str, Any] | None:
    """The turn's message, checked alone and against the stored context: a tool result must
    answer a pending call, and no call of the newest tool round may stay unanswered."""
    cleaned = None
    if message is not None:
        cleaned = turn_message_clean(message, max_bytes=ctxsum_settings.MAX_MESSAGE_BYTES)
        if cleaned["role"] == "tool":
            tool_results_check(conversation, [cleaned])
    context = context_get(conversation=conversation).messages
    if cleaned is None and not context:
        raise MessagesInvalid([{"non_field_errors": [str(NOTHING_TO_ANSWER)]}])
    pending = unanswered_calls([*context, *([cleaned] if cleaned else [])])
    if pending:
        field = "tool_call_id" if cleaned and cleaned["role"] == "tool" else "non_field_errors"
        ids = ", ".join(pending)
        raise MessagesInvalid([{field: [str(UNANSWERED.format(ids=ids))]}])
    return cleaned


@dataclass(frozen=True, kw_only=True)
class _Ask:
    """A turn asked for, checked and reserved."""

    caller: Conversation  # the instance chat_turn was given, updated at the end
    reservation: Reservation
    message: dict[str, Any] | None
    options: dict[str, Any]
    user: Any
    idempotency: Claim | None


@dataclass(frozen=True, kw_only=True)
class _Planned:
    """What the turn plans from: the conversation's row as the reservation left it, never
    the caller's instance (it may be stale), its context, and the compaction due before the
    call (``incoming``: the new message and a reply as long as the newest one; None when
    none is due)."""

    conversation: Conversation
    context: ActiveContext
    new: list[dict[str, Any]]
    new_tokens: int
    incoming: tuple[int, int] | None


def _asked(
    conversation: Conversation,
    message: Any,
    options: dict[str, Any],
    user: Any,
    idempotency: Claim | None,
) -> _Ask:
    """Check the options and the message, then reserve the turn."""
    cleaned_options = options_clean(**options)
    cleaned = _message_check(conversation, message)
    # Copies, once checked: a caller that changes its message or tools while the turn runs
    # (a stream is iterated later) changes neither what is sent nor what is stored.
    cleaned, cleaned_options = copy.deepcopy((cleaned, cleaned_options))
    # The owner by pk only, all the daily count needs: no query for the user's row.
    owner = user if user is not None else SimpleNamespace(pk=conversation.owner_id)
    reservation = turn_reserve(conversation, user=owner, db=write_db(conversation))
    return _Ask(
        caller=conversation,
        reservation=reservation,
        message=cleaned,
        options=cleaned_options,
        user=user,
        idempotency=idempotency,
    )


def _planned(ask: _Ask) -> _Planned:
    """The reserved conversation, its context, and whether it compacts first: when, with
    the new message, it reaches the trigger or exceeds the ceiling, counting a reply as
    long as the newest one, so that neither the call nor the stored pair reaches the
    trigger."""
    rows = Conversation.objects.using(ask.reservation.db)
    conversation = rows.get(pk=ask.reservation.conversation_pk)
    new = [ask.message] if ask.message is not None else []
    new_tokens = sum(messages_count(conversation, new))
    context = context_get(conversation=conversation)
    policy = conversation_policy(conversation)
    incoming = None
    if policy.over(len(context.messages) + len(new), context.token_count + new_tokens):
        # Forced: the stored context alone may be below the trigger; the new message is not.
        replies = (
            row.token_count for row in reversed(context.body_rows) if row.role == "assistant"
        )
        incoming = (len(new) + 1, new_tokens + next(replies, 0))
    return _Planned(
        conversation=conversation,
        context=context,
        new=new,
        new_tokens=new_tokens,
        incoming=incoming,
    )


def _ready(ask: _Ask, planned: _Planned, result: CompactionResult | None) -> _Turn:
    """The turn ready for its call, after the compaction (``result``, None when none was
    due; a failed one raised SummarizerError): the ceiling checked, the request built."""
    conversation, context, compaction = planned.conversation, planned.context, None
    if result is not None:
        # The compacted context to send; read again if the compaction could not read it.
        context = result.context or context_get(conversation=conversation)
        compaction = AutoCompaction(
            compacted=result.compacted,
            reason=result.reason,
            summary_version=result.summary.version if result.summary else None,
            over_trigger=result.over_trigger,
        )
    size, ceiling = context.token_count + planned.new_tokens, context.max_context_tokens
    if ceiling is not None and size > ceiling:
        raise ContextTooLong(CONTEXT_TOO_LONG.format(tokens=size, limit=ceiling))
    options = dict(ask.options)
    primary = options.pop("model", None) or conversation.model or ctxsum_settings.DEFAULT_MODEL
    return _Turn(
        caller=ask.caller,
        conversation=conversation,
        reservation=ask.reservation,
        message=ask.message,
        request=[*context.messages, *planned.new],
        sent=context,
        options=options,
        attempts=Attempts(models=model_chain(primary)),
        user=ask.user,
        compaction=compaction,
        idempotency=ask.idempotency,
    )


class ChatStream(Iterator[Event], AsyncIterator[Event]):
    """A streamed turn: iterating it calls the model and yields each chunk of its answer (an
    OpenAI ``chat.completion.chunk`` as a dict, the usage chunk included), then, once the
    reply is stored, the ChatResult. A failure raises from the iteration; nothing is stored
    then and the reservation is given back, as it is when the stream is closed early.

    Iterate it with ``for`` (the model through ``openai.OpenAI``, ``close()`` to stop) or
    with ``async for`` (through ``openai.AsyncOpenAI``, the commit run in the thread that
    serves the database; ``aclose()`` to stop): one or the other, once."""

    def __init__(self, turn: _Turn) -> None:
        self.turn = turn
        self.result: ChatResult | None = None
        self._started = False
        self._events: Generator[Event, None, None] | None = None
        self._aevents: AsyncGenerator[Event, None] | None = None

    def __next__(self) -> Event:
        self._started = True
        if self._events is None:
            self._events = self._run()
        return next(self._events)

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> Event:
        self._started = True
        if self._aevents is None:
            self._aevents = self._arun()
        return await anext(self._aevents)

    def close(self) -> None:
        """Stop: a turn not stored yet gives its reservation back."""
        if not self._started:
            turn_release(self.turn.reservation)
        if self._events is not None:
            self._events.close()

    async def aclose(self) -> None:
        """``close()`` for a stream iterated with ``async for``."""
        if not self._started:
            await database_sync_to_async(turn_release)(self.turn.reservation)
        if self._aevents is not None:
            await self._aevents.aclose()

    def _run(self) -> Generator[Event, None, None]:
        turn, builder = self.turn, ReplyBuilder()
        try:
            for chunk in stream_model(turn.attempts, turn.request, turn.options):
                builder.add(chunk)
                yield chunk
            reply, finish = _streamed_reply(builder)
            self.result = _commit(turn, reply, builder.usage, finish, streamed=True)
        except BaseException:
            # A model error, a refused commit, or the client gone (GeneratorExit).
            turn_release(turn.reservation)
            raise
        yield self.result

    async def _arun(self) -> AsyncGenerator[Event, None]:
        turn, builder = self.turn, ReplyBuilder()
        try:
            async with aclosing(astream_model(turn.attempts, turn.request, turn.options)) as chunks:
                async for chunk in chunks:
                    builder.add(chunk)
                    yield chunk
            reply, finish = _streamed_reply(builder)
            self.result = await database_sync_to_async(_commit)(
                turn, reply, builder.usage, finish, streamed=True
            )
        except BaseException:
            # As _run's; a cancelled task too (the ASGI client gone).
            await database_sync_to_async(turn_release)(turn.reservation)
            raise
        yield self.result


def _streamed_reply(builder: ReplyBuilder) -> tuple[dict[str, Any], str]:
    """The reply a finished stream built, checked, and its finish reason; a stream cut off
    without one is a ModelError."""
    if builder.finish_reason is None:
        raise ModelError(client.STREAM_UNFINISHED, transient=True)
    return reply_clean(builder.message()), builder.finish_reason


def _commit(
    turn: _Turn, reply: dict[str, Any], usage: Usage, finish_reason: str, *, streamed: bool
) -> ChatResult:
    """Store the new message and the reply, adjacent, with the turn's record, and release
    the turn lock: one transaction under the row lock, filtered on the turn lock."""
    conversation, attempts = turn.conversation, turn.attempts
    rows = [turn.message, reply] if turn.message is not None else [reply]
    counts = messages_count(conversation, rows)
    db = turn.reservation.db
    with transaction.atomic(using=db):
        try:
            locked = turn_lock(turn.reservation)
        except LeaseLost as lost:
            raise TurnInProgress(TURN_TAKEN_OVER) from lost
        if not _sent_unredacted(locked, turn.sent):
            raise ContextRedacted(CONTEXT_REDACTED)
        key_applied(turn.idempotency)
        if locked.model != conversation.model:
            # The model changed during the call: counted with the encoding it names now.
            counts = messages_count(locked, rows)
        stored = messages_insert(locked, rows, counts)
        record = ChatTurn.objects.using(
            db
        ).create(
            conversation=locked,
            user_id=turn.user.pk if turn.user is not None else conversation.owner_id,
            message=stored[0] if turn.message is not None else None,
            reply=stored[-1],
            requested_model=attempts.models[0],
            model=attempts.model,
            attempts=attempts.count,
            fallbacks=attempts.index,
            **asdict(usage),  # prompt, completion, cached and total tokens
            latency_ms=attempts.latency_ms,
            streamed=streamed,
            finish_reason=finish_reason[:32],
        )
        # The turn lock goes with the commit; the turn's call stays counted.
        TURN.release(turn.reservation.conversation_pk, turn.reservation.token, db=db)
        # When the pair brings the context to its trigger, a background compaction is
        # queued for after the commit (never one in this process: the reply is waiting;
        # the next turn compacts before its call if none has run by then).
        autocompact_schedule(locked)
        signal_after_commit("messages_appended", locked, db=db, messages=stored)
    turn.caller.update_from(locked)
    return ChatResult(
        conversation=turn.caller, messages=stored, turn=record, compaction=turn.compaction
    )


def _sent_unredacted(locked: Conversation, sent: ActiveContext) -> bool:
    """Whether nothing the model was sent was redacted since: its summary is not withheld
    since, and its messages are redacted as they were read. A compaction that landed
    during the call (another summary active, the messages archived) changes neither. Under
    the row lock."""
    db = locked._state.db
    if sent.summary is not None:
        summary = Summary.objects.using(db).filter(pk=sent.summary.pk)
        withheld = single(summary.values_list("covers_redacted", flat=True))
        if withheld != sent.summary.covers_redacted:
            return False
    rows = Message.objects.using(db).filter(pk__in=[row.pk for row in sent.rows])
    seen = sum(row.redacted_at is not None for row in sent.rows)
    return rows.filter(redacted_at__isnull=False).count() == seen
