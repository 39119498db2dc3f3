"""The compaction lease: which worker may summarize a conversation now.

Taken with one conditional UPDATE (the row count says who won), renewed before every
summarizer call, released by the commit or on failure. A worker that dies leaves its lease
behind; it is abandoned once older than ``lease_seconds()`` and the next compaction takes it
over. Leases are bookkeeping, not changes: queryset updates leave ``updated_at`` alone.
``leased`` is the frame a compaction, a rebuild and a revert run in: take, give back.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from ctxsum.conf import ctxsum_settings
from ctxsum.models import Conversation

logger = logging.getLogger("ctxsum.compaction")

# Seconds a lease outlives the summarizer timeout when LEASE_SECONDS is not set: the time
# between the answer and the commit.
LEASE_GRACE_SECONDS = 5


class WriteNothing(Exception):
    """The leased work must write nothing (a conflict, no gain), which is not a failure:
    ``leased`` gives the lease back and lets the exception through to say why."""


class LeaseLost(WriteNothing):
    """Another worker took the lease over: whatever this one wrote must not be committed."""


def lease_seconds() -> float:
    """How long a lease holds without renewal: LEASE_SECONDS, else one summarizer call."""
    return ctxsum_settings.LEASE_SECONDS or ctxsum_settings.SUMMARY_TIMEOUT + LEASE_GRACE_SECONDS


def lease_take(conversation: Conversation, *, db: str) -> str | None:
    """Claim the conversation; its lease token, or None while another worker holds a live
    lease. Raises Conversation.DoesNotExist when the conversation is gone."""
    token = uuid.uuid4().hex
    now = timezone.now()
    free = Q(lease_owner="") | Q(leased_at__lte=now - timedelta(seconds=lease_seconds()))
    rows = Conversation.objects.using(db).filter(pk=conversation.pk)
    if rows.filter(free).update(lease_owner=token, leased_at=now):
        return token
    if not rows.exists():
        raise Conversation.DoesNotExist
    return None


def lease_expires(conversation: Conversation) -> datetime | None:
    """When the lease ``conversation`` shows, as read, is abandoned unless renewed; None
    when it shows none."""
    if not conversation.lease_owner or conversation.leased_at is None:
        return None
    return conversation.leased_at + timedelta(seconds=lease_seconds())


def lease_renew(conversation: Conversation, token: str, *, db: str) -> None:
    """Extend the lease before another summarizer call; raises LeaseLost when it is gone."""
    rows = Conversation.objects.using(db).filter(pk=conversation.pk, lease_owner=token)
    if not rows.update(leased_at=timezone.now()):
        raise LeaseLost


def lease_release(conversation: Conversation, token: str, *, db: str) -> None:
    """Give the lease up, if this worker still holds it."""
    rows = Conversation.objects.using(db).filter(pk=conversation.pk, lease_owner=token)
    rows.update(lease_owner="", leased_at=None)


def lease_lock(conversation: Conversation, token: str, *, db: str) -> Conversation:
    """The conversation row, locked for the commit, while this worker still holds the lease
    (the lock is filtered on it). Raises LeaseLost when another worker took it over, and
    Conversation.DoesNotExist when the conversation is gone. Call inside a transaction."""
    rows = Conversation.objects.using(db).filter(pk=conversation.pk)
    locked = rows.select_for_update().filter(lease_owner=token).first()
    if locked is None:
        if not rows.exists():
            raise Conversation.DoesNotExist
        raise LeaseLost
    return locked


@contextmanager
def leased(
    conversation: Conversation,
    *,
    db: str,
    failed: Callable[[BaseException], None] | None = None,
) -> Iterator[str | None]:
    """Take the conversation's lease for the body: yields its token, or None (nothing
    taken) while another worker holds a live lease. Raises Conversation.DoesNotExist when
    the conversation is gone.

    A body that ends without raising leaves the lease as its commit left it: released in
    the same write. One that raises gives the lease up and tells ``failed`` of the error
    (unless it is WriteNothing: a conflict, no gain), then the error goes on. So does one
    stopped by what is not an ``Exception`` (KeyboardInterrupt, SystemExit, a worker's
    timeout, a cancellation: ``failed`` records it as ``interrupted``), which must go on as
    it came: a release or a record that fails then (the database went away with the worker)
    is logged, never raised in its place. An error taking the lease, or
    Conversation.DoesNotExist from the body (deleted meanwhile), goes on untouched: nothing
    to release, nothing to record.
    """
    token = lease_take(conversation, db=db)
    if token is None:
        yield None
        return
    try:
        yield token
    except Conversation.DoesNotExist:
        raise  # deleted meanwhile: nothing left to release or record
    except WriteNothing:
        lease_release(conversation, token, db=db)
        raise
    except Exception as error:
        lease_release(conversation, token, db=db)
        if failed is not None:
            failed(error)
        raise
    except BaseException as interruption:
        _interrupted(conversation, token, db=db, failed=failed, interruption=interruption)
        raise


def _interrupted(
    conversation: Conversation,
    token: str,
    *,
    db: str,
    failed: Callable[[BaseException], None] | None,
    interruption: BaseException,
) -> None:
    """Release the lease and record ``interruption``, neither of which may replace it: a
    SystemExit turned into a DatabaseError would keep a worker that was told to stop
    running. What fails is logged; a lease left held frees once abandoned."""
    name = type(interruption).__name__
    try:
        lease_release(conversation, token, db=db)
    except Exception:
        logger.exception(
            "Could not release the lease on conversation %s after %s; it frees in %s s.",
            conversation.pk,
            name,
            lease_seconds(),
        )
    if failed is None:
        return
    try:
        failed(interruption)
    except Conversation.DoesNotExist:
        pass  # deleted meanwhile: nothing to record
    except Exception:
        logger.exception(
            "Could not record the interruption (%s) of work on conversation %s.",
            name,
            conversation.pk,
        )
