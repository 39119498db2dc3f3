"""The compaction task for Celery: ``CTXSUM["COMPACTION_RUNNER"] = "celery"``.

Celery is not a dependency of ctxsum: install it yourself, and have your Celery workers
import this module (``app.autodiscover_tasks(["ctxsum"], related_name="celery_tasks")``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery import shared_task

from ctxsum.services import conversation_compact_queued


@shared_task(name="ctxsum.compact_conversation")  # type: ignore[untyped-decorator]
def compact_conversation(
    conversation_id: str, database: str, since: str | None = None
) -> dict[str, Any]:
    """AUTO_COMPACT's background task (``conversation_compact_queued``)."""
    return conversation_compact_queued(
        conversation_id=conversation_id, database=database, since=since, defer=compaction_defer
    ).as_json()


def compaction_enqueue(conversation_id: str, database: str) -> None:
    """Send ``compact_conversation`` to the Celery broker."""
    compact_conversation.delay(conversation_id, database)


def compaction_defer(
    conversation_id: str, database: str, run_after: datetime, since: str | None
) -> None:
    """Send ``compact_conversation`` to run at ``run_after`` (none in eager mode)."""
    if compact_conversation.app.conf.task_always_eager:
        return
    compact_conversation.apply_async((conversation_id, database, since), eta=run_after)
