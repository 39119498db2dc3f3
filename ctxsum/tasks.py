"""Task definitions for Django's tasks framework: each one a thin call into a service.

``django.tasks`` is built into Django from 6.0; on Django 5.2 the ``django-tasks`` package
is its backport, with the same API under ``django_tasks``. The task runs on the backend of
the project's ``TASKS`` setting (in production, ``django_tasks_db.DatabaseBackend`` and its
``db_worker`` processes); ``compaction_enqueue`` is what ``COMPACTION_RUNNER = "tasks"``
calls once an append has committed, and ``compaction_defer`` what the task calls to run
again later (``run_after``): the check that retries a compaction lost with its worker.

Importing this module builds the task, which checks it against the configured backend: it
is imported when first needed, never by ``ctxsum`` itself at start-up.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ctxsum.services import conversation_compact_queued

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@task()
def compact_conversation(
    conversation_id: str, database: str, since: str | None = None
) -> dict[str, Any]:
    """Compact a conversation that reached its trigger (AUTO_COMPACT's background task);
    with ``since``, the deferred check of a compaction that started then."""
    return conversation_compact_queued(
        conversation_id=conversation_id, database=database, since=since, defer=compaction_defer
    ).as_json()


def compaction_enqueue(conversation_id: str, database: str) -> None:
    """Enqueue ``compact_conversation`` on the default task backend."""
    compact_conversation.enqueue(conversation_id, database)


def compaction_defer(
    conversation_id: str, database: str, run_after: datetime, since: str | None
) -> None:
    """Enqueue ``compact_conversation`` to run once ``run_after`` has passed, on a backend
    that defers tasks (django-tasks-db's: a ``db_worker`` takes it then). A backend that
    cannot (the immediate one, which runs a task inside the call) is given none."""
    # Asked first: the immediate backend refuses even to be given a run_after.
    if compact_conversation.get_backend().supports_defer:
        deferred = compact_conversation.using(run_after=run_after)
        deferred.enqueue(conversation_id, database, since)
