"""Which database ctxsum writes to.

Every transaction of the services names its database the way the project's routers say
(``router.db_for_write``), and every query inside it goes to that database: with ctxsum's
models routed to a database of their own, a lock, the writes under it and the ``on_commit``
hooks after them all happen there (docs/architecture.md, "Transactions").
"""

from __future__ import annotations

from django.db import router

from ctxsum.models import Conversation


def write_db(conversation: Conversation | None = None) -> str:
    """The alias of the database ctxsum's rows are written to."""
    return router.db_for_write(Conversation, instance=conversation)
