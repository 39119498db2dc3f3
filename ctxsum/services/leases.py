"""The compaction lease: which worker may summarize a conversation now. A ``RowLease`` on
the conversation's ``lease_owner`` and ``leased_at``; ``leased`` is the frame a compaction,
a rebuild and a revert run in.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from ctxsum.conf import ctxsum_settings
from ctxsum.models import Conversation
from ctxsum.services.row_lease import LeaseLost as LeaseLost
from ctxsum.services.row_lease import RowLease
from ctxsum.threads import database_sync_to_async

logger = logging.getLogger("ctxsum.compaction")

# Seconds a lease outlives the summarizer timeout when LEASE_SECONDS is not set: the time
# between the answer and the commit.
LEASE_GRACE_SECONDS = 5


class WriteNothing(Exception):
    """The leased work must write nothing (a conflict, no gain), which is not a failure."""


def lease_seconds() -> float:
    """How long a lease holds without renewal: LEASE_SECONDS, else one summarizer call."""
    return ctxsum_settings.LEASE_SECONDS or ctxsum_settings.SUMMARY_TIMEOUT + LEASE_GRACE_SECONDS


LEASE = RowLease(
    model=Conversation, owner="lease_owner", since="leased_at", stale_after=lease_seconds
)
lease_take, lease_renew, lease_lock = LEASE.take, LEASE.renew, LEASE.lock
lease_release, lease_expires = LEASE.release, LEASE.expires


@contextmanager
def leased(
    conversation: Conversation, *, db: str, failed: Callable[[BaseException], None] | None = None
) -> Iterator[str | None]:
    """Take the conversation's lease for the body: yields its token, or None while another
    worker holds a live lease. A body that raises gives the lease up and, unless it is
    WriteNothing or LeaseLost, tells ``failed`` of the error (an interruption too)."""
    token = lease_take(conversation, db=db)
    if token is None:
        yield None
        return
    try:
        yield token
    except BaseException as error:
        _given_up(conversation, token, db=db, failed=failed, error=error)
        raise


@asynccontextmanager
async def aleased(
    conversation: Conversation, *, db: str, failed: Callable[[BaseException], None] | None = None
) -> AsyncIterator[str | None]:
    """``leased`` for a body that awaits (``aconversation_compact``): the lease taken and
    given up as ``leased`` does, in the thread that serves the database."""
    token = await database_sync_to_async(lease_take)(conversation, db=db)
    if token is None:
        yield None
        return
    try:
        yield token
    except BaseException as error:
        await database_sync_to_async(_given_up)(
            conversation, token, db=db, failed=failed, error=error
        )
        raise


def _given_up(
    conversation: Conversation,
    token: str,
    *,
    db: str,
    failed: Callable[[BaseException], None] | None,
    error: BaseException,
) -> None:
    """What a body that raised ``error`` leaves: the lease released (none to release for a
    conversation deleted meanwhile) and, unless the body was to write nothing, ``failed``
    told."""
    if isinstance(error, Conversation.DoesNotExist):
        return  # deleted meanwhile: nothing left to release or record
    if isinstance(error, WriteNothing | LeaseLost):
        lease_release(conversation, token, db=db)
    elif isinstance(error, Exception):
        lease_release(conversation, token, db=db)
        if failed is not None:
            failed(error)
    else:
        _interrupted(conversation, token, db=db, failed=failed, interruption=error)


def _interrupted(
    conversation: Conversation,
    token: str,
    *,
    db: str,
    failed: Callable[[BaseException], None] | None,
    interruption: BaseException,
) -> None:
    """Release the lease and record ``interruption``, neither of which may replace it (a
    worker told to stop must stop): what fails is logged."""
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
