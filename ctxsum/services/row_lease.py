"""A lease on a row that outlives a transaction: who may do the slow work (a model call)
between a short claim and its commit. Every write is a conditional UPDATE (the row count
says who won); a lease not renewed for ``stale_after()`` seconds is taken over, and its
former holder finds it lost (``LeaseLost``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from django.db.models import Model, Q, QuerySet
from django.utils import timezone

from ctxsum.exceptions import CtxsumError

M = TypeVar("M", bound=Model)


class LeaseLost(CtxsumError):
    """Another holder took the lease over, or it is gone: write nothing."""


@dataclass(frozen=True, kw_only=True)
class RowLease(Generic[M]):
    """A lease in ``model``'s fields ``owner`` (the holder's token, "" when free) and
    ``since`` (when taken or last renewed). ``row`` is a row or its pk."""

    model: type[M]
    owner: str
    since: str
    stale_after: Callable[[], float]

    def free(self, now: datetime) -> Q:
        """The rows whose lease is free, or abandoned by ``now``."""
        cutoff = now - timedelta(seconds=self.stale_after())
        return Q(**{self.owner: ""}) | Q(**{f"{self.since}__lte": cutoff})

    def held(self, row: Any, token: str, *, db: str) -> QuerySet[M]:
        """The row while ``token`` holds its lease."""
        return self._rows(row, db).filter(**{self.owner: token})

    def take(
        self, row: Any, *, db: str, now: datetime | None = None, where: Q | None = None, **also: Any
    ) -> str | None:
        """The token of the lease taken if free or abandoned (and ``where`` holds), setting
        ``also`` too; else None. Raises the model's DoesNotExist when the row is gone."""
        token, now, rows = uuid.uuid4().hex, now or timezone.now(), self._rows(row, db)
        claim = rows.filter(self.free(now))
        if claim.filter(where or Q()).update(**{self.owner: token, self.since: now}, **also):
            return token
        _exists(rows)
        return None

    def update(self, row: Any, token: str, *, db: str, **fields: Any) -> None:
        """Set ``fields`` while ``token`` holds the lease; raises LeaseLost when it does not."""
        if not self.held(row, token, db=db).update(**fields):
            raise LeaseLost

    def renew(self, row: Any, token: str, *, db: str) -> None:
        """Restart the lease's clock before more slow work; raises LeaseLost when lost."""
        self.update(row, token, db=db, **{self.since: timezone.now()})

    def release(self, row: Any, token: str, *, db: str, **also: Any) -> bool:
        """Give the lease up, setting ``also`` too, if ``token`` holds it; whether it did."""
        held = self.held(row, token, db=db)
        return bool(held.update(**{self.owner: "", self.since: None}, **also))

    def lock(self, row: Any, token: str, *, db: str) -> M:
        """The row, locked (filtered on ``token``), for the commit; raises LeaseLost or the
        model's DoesNotExist."""
        rows = self._rows(row, db)
        locked = rows.select_for_update().filter(**{self.owner: token}).first()
        if locked is None:
            _exists(rows)
            raise LeaseLost
        return locked

    def expires(self, row: M) -> datetime | None:
        """When the lease ``row`` shows, as read, is abandoned unless renewed; None if none."""
        since: datetime | None = getattr(row, self.since)
        if not getattr(row, self.owner) or since is None:
            return None
        return since + timedelta(seconds=self.stale_after())

    def abandoned(self, row: M, now: datetime) -> bool:
        """Whether ``row``, as read, shows a lease held but abandoned by ``now``."""
        expires = self.expires(row)
        return expires is not None and expires <= now

    def _rows(self, row: Any, db: str) -> QuerySet[M]:
        pk = row.pk if isinstance(row, Model) else row
        return self.model._default_manager.using(db).filter(pk=pk)


def _exists(rows: QuerySet[Any]) -> None:
    """Raise the model's own DoesNotExist (the one its callers catch) when the row is gone."""
    if not rows.exists():
        raise rows.model.DoesNotExist
