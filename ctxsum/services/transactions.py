"""Which database ctxsum writes to.

Every transaction of the services names its database the way the project's routers say
(``router.db_for_write``), and every query inside it goes to that database: with ctxsum's
models routed to a database of their own, a lock, the writes under it and the ``on_commit``
hooks after them all happen there (docs/architecture.md, "Transactions").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import router, transaction

from ctxsum.models import Conversation

logger = logging.getLogger("ctxsum")


def write_db(conversation: Conversation | None = None) -> str:
    """The alias of the database ctxsum's rows are written to."""
    return router.db_for_write(Conversation, instance=conversation)


def after_commit(func: Callable[[], Any], *, using: str, what: str) -> None:
    """Run ``func`` (a signal's send) once the transaction on ``using`` commits. What it
    raises is logged with ``what`` it was, never raised: the write committed, and whoever
    asked is told so."""

    def run() -> None:
        try:
            func()
        except Exception:
            logger.exception("%s failed after the commit; what it followed stands.", what)

    transaction.on_commit(run, using=using)
