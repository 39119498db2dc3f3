"""Task definitions for Django's tasks framework (``django.tasks``, or its backport
``django_tasks`` on Django 5.2): ``compaction_enqueue`` is what ``COMPACTION_RUNNER =
"tasks"`` calls. Importing this module checks the task against the configured backend: it
is imported when first needed, never at start-up.
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
    """AUTO_COMPACT's background task (``conversation_compact_queued``)."""
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
    that defers tasks (the immediate one, which cannot, is given none)."""
    # Asked first: the immediate backend refuses even to be given a run_after.
    if compact_conversation.get_backend().supports_defer:
        deferred = compact_conversation.using(run_after=run_after)
        deferred.enqueue(conversation_id, database, since)
