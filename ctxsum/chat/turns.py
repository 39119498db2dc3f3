"""A chat turn's reservation: the conversation's turn lock (a ``RowLease`` on its chat
state) and one model call of each limit, taken by conditional UPDATEs in one short
transaction, so two turns racing for the last call cannot both win (docs/architecture.md,
"The chat turn", step 2). A failed turn gives it all back; a lock its dead worker left is
taken over after CHAT_TURN_SECONDS, its call still counted: the provider may have billed it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, NoReturn

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ctxsum.chat.conf import chat_settings
from ctxsum.chat.exceptions import CallLimitReached, TurnInProgress
from ctxsum.chat.models import ChatCallDay, ChatState
from ctxsum.models import Conversation
from ctxsum.services.row_lease import LeaseLost, RowLease

CONVERSATION_LIMIT = _("This conversation has made its {limit} model calls.")
USER_DAY_LIMIT = _("You have made your {limit} model calls for today (UTC).")
logger = logging.getLogger("ctxsum.chat")

IN_PROGRESS = _("Another turn of this conversation is in progress; try again when it is done.")
TURN = RowLease(
    model=ChatState,
    owner="turn_owner",
    since="turn_started_at",
    stale_after=lambda: chat_settings.CHAT_TURN_SECONDS,
)


@dataclass(frozen=True, kw_only=True)
class Reservation:
    """A turn's hold on its conversation and on one call of each limit."""

    conversation_pk: Any
    token: str
    user_pk: Any  # the user whose day counts the call; None without a per-user limit
    day: date
    db: str


def turn_reserve(conversation: Conversation, *, user: Any, db: str) -> Reservation:
    """Take the conversation's turn lock and one call of each limit. Raises TurnInProgress,
    CallLimitReached (nothing taken then) or Conversation.DoesNotExist."""
    now, limit = timezone.now(), chat_settings.CHAT_MAX_CALLS_PER_CONVERSATION
    under = None if limit is None else Q(chat_calls__lt=limit)
    with transaction.atomic(using=db):
        token = _take(conversation.pk, db=db, now=now, where=under)
        if token is None:
            _refuse(conversation, limit, db=db)
        user_pk = _day_reserve(user, now.date(), db=db)
    return Reservation(
        conversation_pk=conversation.pk, token=token, user_pk=user_pk, day=now.date(), db=db
    )


def _take(pk: Any, *, db: str, now: datetime, where: Q | None) -> str | None:
    """The turn lock and one call of the conversation's count, or None when refused. A
    conversation that has no chat state yet (made before the app was installed) gets one
    first. Raises Conversation.DoesNotExist."""
    calls = F("chat_calls") + 1
    try:
        return TURN.take(pk, db=db, now=now, where=where, chat_calls=calls)
    except ChatState.DoesNotExist:
        # Locked, not only looked up: a delete meanwhile would fail the state's row at commit.
        if not Conversation.objects.using(db).select_for_update().filter(pk=pk).exists():
            raise Conversation.DoesNotExist from None
        ChatState.objects.using(db).get_or_create(conversation_id=pk)
        return TURN.take(pk, db=db, now=now, where=where, chat_calls=calls)


def _refuse(conversation: Conversation, limit: int | None, *, db: str) -> NoReturn:
    """Why the claim left the row, which exists, alone: the limit, or another turn's lock.
    Read after the claim: a lock released meanwhile was still held when the claim ran,
    while a call count never goes down but by a failed turn's release."""
    rows = ChatState.objects.using(db).filter(pk=conversation.pk)
    if limit is not None and not rows.filter(chat_calls__lt=limit).exists():
        raise CallLimitReached(CONVERSATION_LIMIT.format(limit=limit), scope="conversation")
    raise TurnInProgress(IN_PROGRESS)


def _day_reserve(user: Any, day: date, *, db: str) -> Any:
    """Count one call on ``user``'s row of ``day``; its pk, or None without a limit (or
    without a user). Raises CallLimitReached when the day's calls are used up."""
    limit = chat_settings.CHAT_MAX_CALLS_PER_USER_PER_DAY
    if limit is None or user is None:
        return None
    # A first call of the day creates the row; racing creators meet on the unique
    # constraint and get_or_create reads the winner's row.
    ChatCallDay.objects.using(db).get_or_create(user_id=user.pk, day=day)
    rows = ChatCallDay.objects.using(db).filter(user_id=user.pk, day=day, calls__lt=limit)
    if not rows.update(calls=F("calls") + 1):
        raise CallLimitReached(USER_DAY_LIMIT.format(limit=limit), scope="user_day")
    return user.pk


def turn_release(reservation: Reservation) -> None:
    """Give the reservation back after a failed turn: the lock, and its call on each
    count, if the turn still holds the lock (a turn taken over keeps its call counted).

    Called on any exit of a turn, while the error that ended it goes on (a model error,
    KeyboardInterrupt, a cancellation, the client gone): a release that fails itself (the
    database is unusable) is logged, never raised in its place; the lock then frees once
    CHAT_TURN_SECONDS have passed, like a dead worker's."""
    try:
        _release(reservation)
    except Exception:
        logger.exception(
            "Could not give back the turn reservation of conversation %s; its lock frees "
            "after CHAT_TURN_SECONDS.",
            reservation.conversation_pk,
        )


def _release(reservation: Reservation) -> None:
    db = reservation.db
    with transaction.atomic(using=db):
        released = TURN.release(
            reservation.conversation_pk, reservation.token, db=db, chat_calls=F("chat_calls") - 1
        )
        if released and reservation.user_pk is not None:
            ChatCallDay.objects.using(db).filter(
                user_id=reservation.user_pk, day=reservation.day, calls__gt=0
            ).update(calls=F("calls") - 1)


def turn_lock(reservation: Reservation) -> Conversation:
    """The conversation row, locked for the commit with its chat state (one query: the
    join locks both rows), while the turn still holds its lock. Raises LeaseLost when
    another turn took it over, Conversation.DoesNotExist when the conversation is gone.
    Call inside a transaction."""
    rows = Conversation.objects.using(reservation.db).filter(pk=reservation.conversation_pk)
    held = {f"chat_state__{TURN.owner}": reservation.token}
    locked = rows.select_for_update().filter(**held).first()
    if locked is None:
        if not rows.exists():
            raise Conversation.DoesNotExist
        raise LeaseLost
    return locked
