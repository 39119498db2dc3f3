"""Task definitions for Django's tasks framework: each one a thin call into a service.

``django.tasks`` is built into Django from 6.0; on Django 5.2 the ``django-tasks`` package
is its backport, with the same API under ``django_tasks``. The task runs on the backend of
the project's ``TASKS`` setting (in production, ``django_tasks_db.DatabaseBackend`` and its
``db_worker`` processes); ``compaction_enqueue`` is what ``COMPACTION_RUNNER = "tasks"``
calls once an append has committed.

Importing this module builds the task, which checks it against the configured backend: it
is imported when first needed, never by ``ctxsum`` itself at start-up.
"""

from __future__ import annotations

from typing import Any

from ctxsum.services.autocompact import conversation_compact_queued

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@task()
def compact_conversation(conversation_id: str, database: str) -> dict[str, Any]:
    """Compact a conversation that reached its trigger (AUTO_COMPACT's background task)."""
    return conversation_compact_queued(conversation_id=conversation_id, database=database).as_json()


def compaction_enqueue(conversation_id: str, database: str) -> None:
    """Enqueue ``compact_conversation`` on the default task backend."""
    compact_conversation.enqueue(conversation_id, database)
