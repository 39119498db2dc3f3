"""Which database ctxsum writes to (the routers' ``db_for_write``), and work after a commit
(docs/architecture.md, "Transactions").
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
    """Run ``func`` (a signal's send) once the transaction on ``using`` commits; what it
    raises is logged as ``what``, never raised: the write committed."""

    def run() -> None:
        try:
            func()
        except Exception:
            logger.exception("%s failed after the commit; what it followed stands.", what)

    transaction.on_commit(run, using=using)
