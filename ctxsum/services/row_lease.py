"""A lease on a row that outlives a transaction: who may do the slow work (a model call)
between a short claim and the commit, the compaction lease, the chat turn lock and an
Idempotency-Key's claim alike.

The row holds the holder's random token and when it took or last renewed the lease. Every
write is a conditional UPDATE, so the row count says who won, and none waits for another
holder. A holder that dies leaves its lease behind; ``stale_after()`` seconds on, it is
abandoned and the next taker takes it over: the former holder then finds it lost
(``LeaseLost``) when it renews it or locks the row to commit. Queryset updates leave
``updated_at`` alone: a lease is bookkeeping, not a change of the row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet
from django.utils import timezone

from ctxsum.exceptions import CtxsumError

M = TypeVar("M", bound=Model)


class LeaseLost(CtxsumError):
    """Another holder took the lease over, or it is gone: what this one was writing must
    not be committed."""


@dataclass(frozen=True, kw_only=True)
class RowLease:
    """The lease held in a model's fields ``owner`` (the holder's token, "" when free) and
    ``since`` (when it was taken or last renewed), abandoned ``stale_after()`` seconds
    later (read on each use: settings change). Methods take ``rows``, a queryset of the
    one row the lease is on."""

    owner: str
    since: str
    stale_after: Callable[[], float]

    def free(self, now: datetime) -> Q:
        """The rows whose lease is free, or abandoned by ``now``."""
        cutoff = now - timedelta(seconds=self.stale_after())
        return Q(**{self.owner: ""}) | Q(**{f"{self.since}__lte": cutoff})

    def held(self, rows: QuerySet[M], token: str) -> QuerySet[M]:
        """``rows`` while ``token`` holds their lease."""
        return rows.filter(**{self.owner: token})

    def take(
        self, rows: QuerySet[M], *, now: datetime | None = None, where: Q | None = None, **also: Any
    ) -> str | None:
        """Take the lease when it is free or abandoned (and ``where`` holds), setting
        ``also`` in the same UPDATE: its new token, or None when the row is held (or fails
        ``where``). Raises the model's DoesNotExist when the row is gone."""
        token, now = uuid.uuid4().hex, now or timezone.now()
        claim = rows.filter(self.free(now))
        if where is not None:
            claim = claim.filter(where)
        if claim.update(**{self.owner: token, self.since: now}, **also):
            return token
        _exists(rows)
        return None

    def update(self, rows: QuerySet[M], token: str, **fields: Any) -> None:
        """Set ``fields`` while ``token`` holds the lease; raises LeaseLost when it does not."""
        if not self.held(rows, token).update(**fields):
            raise LeaseLost

    def renew(self, rows: QuerySet[M], token: str) -> None:
        """Restart the lease's clock before more slow work; raises LeaseLost when lost."""
        self.update(rows, token, **{self.since: timezone.now()})

    def release(self, rows: QuerySet[M], token: str, **also: Any) -> bool:
        """Give the lease up, setting ``also`` in the same UPDATE, if ``token`` still holds
        it; whether it did."""
        return bool(self.held(rows, token).update(**{self.owner: "", self.since: None}, **also))

    def lock(self, rows: QuerySet[M], token: str) -> M:
        """The row, locked for the commit, while ``token`` holds the lease (the lock is
        filtered on it). Raises LeaseLost when another holder took it over, the model's
        DoesNotExist when the row is gone. Call inside a transaction."""
        locked = self.held(rows.select_for_update(), token).first()
        if locked is None:
            _exists(rows)
            raise LeaseLost
        return locked

    def expires(self, row: Model) -> datetime | None:
        """When the lease ``row`` shows, as read, is abandoned unless renewed; None when it
        shows none."""
        since: datetime | None = getattr(row, self.since)
        if not getattr(row, self.owner) or since is None:
            return None
        return since + timedelta(seconds=self.stale_after())

    def abandoned(self, row: Model, now: datetime) -> bool:
        """Whether ``row``, as read, shows a lease held but abandoned by ``now``."""
        expires = self.expires(row)
        return expires is not None and expires <= now


def _exists(rows: QuerySet[Any]) -> None:
    """Raise the model's own DoesNotExist (the one its callers catch) when the row is gone."""
    if not rows.exists():
        raise rows.model.DoesNotExist
