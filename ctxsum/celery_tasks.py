"""The compaction task for Celery, for projects that run Celery rather than Django's tasks
framework: ``CTXSUM["COMPACTION_RUNNER"] = "celery"``.

Celery is not a dependency of ctxsum: install it yourself, and have your Celery workers
import this module (``app.autodiscover_tasks(["ctxsum"], related_name="celery_tasks")``, or
Celery's ``imports`` setting), so they know the task by its name.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from ctxsum.services.autocompact import conversation_compact_queued


@shared_task(name="ctxsum.compact_conversation")  # type: ignore[untyped-decorator]
def compact_conversation(conversation_id: str, database: str) -> dict[str, Any]:
    """Compact a conversation that reached its trigger (AUTO_COMPACT's background task)."""
    return conversation_compact_queued(conversation_id=conversation_id, database=database).as_json()


def compaction_enqueue(conversation_id: str, database: str) -> None:
    """Send ``compact_conversation`` to the Celery broker."""
    compact_conversation.delay(conversation_id, database)
