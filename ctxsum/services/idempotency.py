"""Idempotency keys: a request sent with a key runs once; a retry with the same key is
answered with the first answer, and stores nothing new. A claim is a ``RowLease`` on
``token`` and ``claimed_at``, taken with one INSERT (the unique constraint decides between
concurrent requests); docs/architecture.md, "Idempotency keys", tells the whole life of a key.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from ctxsum.conf import ctxsum_settings
from ctxsum.models import Conversation, IdempotencyKey
from ctxsum.services.row_lease import RowLease
from ctxsum.services.transactions import write_db

logger = logging.getLogger("ctxsum.idempotency")

State = IdempotencyKey.State
# How often a claim retries when the row it lost to vanished or changed meanwhile.
CLAIM_TRIES = 3
CLAIM = RowLease(
    model=IdempotencyKey,
    owner="token",
    since="claimed_at",
    stale_after=lambda: ctxsum_settings.IDEMPOTENCY_CLAIM_SECONDS,
)


class Found(enum.Enum):
    """What a key's row says about a request that wants to claim it."""

    REUSED = "reused"  # another request (endpoint or body) holds the key
    IN_PROGRESS = "in_progress"  # the request with this key is still running
    ANSWER_LOST = "answer_lost"  # it was applied, and its worker died before answering


@dataclass(frozen=True, kw_only=True)
class Claim:
    """The key this request holds: the row, the request's token, and its database."""

    pk: int
    token: str
    db: str


@dataclass(frozen=True, kw_only=True)
class Answer:
    """The answer stored for a key: what a retry is answered."""

    status: int
    data: Any


def fingerprint(method: str, operation: str, body: bytes) -> str:
    """What identifies a request under its key: method, operation and raw body."""
    digest = hashlib.sha256()
    for part in (method.upper().encode(), operation.encode(), body):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def key_claim(
    *, owner: Any, conversation: Conversation, key: str, operation: str, fingerprint: str
) -> Claim | Answer | Found:
    """Claim ``key`` for a request; or the stored answer of the request that had it, or
    why the request may not run now (``Found``). Expired keys are taken over as if new."""
    db = write_db(conversation)
    rows = IdempotencyKey.objects.using(db).filter(owner=owner, conversation=conversation, key=key)
    for _ in range(CLAIM_TRIES):
        now, token = timezone.now(), uuid.uuid4().hex
        fresh = {
            "operation": operation,
            "fingerprint": fingerprint,
            "state": State.IN_PROGRESS,
            "token": token,
            "claimed_at": now,
            "applied_at": None,
            "status_code": None,
            "response": "",
            "answered_at": None,
            "created_at": now,
        }
        try:
            with transaction.atomic(using=db):
                row = IdempotencyKey.objects.using(db).create(
                    owner=owner, conversation=conversation, key=key, **fresh
                )
            return Claim(pk=row.pk, token=token, db=db)
        except IntegrityError:
            pass
        found = rows.first()
        if found is None:
            continue  # given back meanwhile: claim it anew
        held = rows.filter(pk=found.pk, token=found.token)  # as long as no one took it over
        running = found.state == State.IN_PROGRESS and not CLAIM.abandoned(found, now)
        age = now - found.created_at
        if age >= timedelta(seconds=ctxsum_settings.IDEMPOTENCY_KEY_SECONDS) and not running:
            if held.update(**fresh):
                return Claim(pk=found.pk, token=token, db=db)
            continue
        if found.fingerprint != fingerprint:
            return Found.REUSED
        if found.state == State.DONE:
            return Answer(status=found.status_code or 200, data=json.loads(found.response))
        if not CLAIM.abandoned(found, now):
            return Found.IN_PROGRESS
        if found.applied_at is not None:
            return Found.ANSWER_LOST
        # Its worker died before writing anything: this request runs instead.
        if held.filter(applied_at__isnull=True).update(token=token, claimed_at=now):
            return Claim(pk=found.pk, token=token, db=db)
    return Found.IN_PROGRESS


def key_applied(claim: Claim | None) -> None:
    """Mark the claim applied; call inside the transaction of the write it guards, so the
    two commit together. Raises LeaseLost (rolling the write back) when another request
    took the claim over. No claim: nothing to do, and no query."""
    if claim is not None:
        CLAIM.update(claim.pk, claim.token, db=claim.db, applied_at=timezone.now())


def key_answer(claim: Claim, *, status: int, data: Any) -> None:
    """Store the answer of the request that holds ``claim``: retries get it from now on."""
    CLAIM.held(claim.pk, claim.token, db=claim.db).update(
        state=State.DONE,
        status_code=status,
        response=json.dumps(data, cls=DjangoJSONEncoder),
        answered_at=timezone.now(),
    )


def key_release(claim: Claim) -> None:
    """Give the key back after a request that wrote nothing (it answered an error, or
    stopped on any exception, KeyboardInterrupt and cancellations included): a retry runs
    anew. An applied claim is kept: its write must not run twice. A release that fails
    itself (the database is unusable) is logged, never raised in place of the error that
    ended the request; the claim is then taken over once abandoned."""
    try:
        CLAIM.held(claim.pk, claim.token, db=claim.db).filter(applied_at__isnull=True).delete()
    except Exception:
        logger.exception(
            "Could not give back the Idempotency-Key claim %s; a retry takes it over after "
            "IDEMPOTENCY_CLAIM_SECONDS.",
            claim.pk,
        )


def keys_expired_delete(*, db: str | None = None) -> int:
    """Delete the keys older than IDEMPOTENCY_KEY_SECONDS; how many were deleted. A key
    still claimed by a request that has not given it up yet is kept."""
    now = timezone.now()
    expired = Q(created_at__lte=now - timedelta(seconds=ctxsum_settings.IDEMPOTENCY_KEY_SECONDS))
    live_claim = Q(
        state=State.IN_PROGRESS, claimed_at__gt=now - timedelta(seconds=CLAIM.stale_after())
    )
    rows = IdempotencyKey.objects.using(db or write_db())
    deleted, _ = rows.filter(expired & ~live_claim).delete()
    return deleted
