"""The compaction that follows an append when ``AUTO_COMPACT`` is on.

It runs once the append has committed, never inside it: the summarizer call must not run
while the append's row lock is held, and its failure must never undo the append.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial

from django.db import transaction
from django.utils.translation import gettext_lazy as _

from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import SummarizerError
from ctxsum.models import Conversation
from ctxsum.policy import Reason
from ctxsum.services.compaction import conversation_compact, failure_reason
from ctxsum.services.transactions import write_db

logger = logging.getLogger("ctxsum.compaction")

DELETED = _("The conversation was deleted.")
# The provider's own words go to the attempt record and the log, not to the client.
SUMMARIZER_FAILED = _("The summarizer failed; the compaction attempt records why.")


@dataclass(frozen=True, kw_only=True)
class AutoCompaction:
    """What the automatic compaction after an append did, for the append's answer."""

    compacted: bool
    reason: Reason
    summary_version: int | None = None
    over_trigger: bool = False
    detail: str = ""


def conversation_autocompact(*, conversation: Conversation) -> AutoCompaction | None:
    """After an append has committed: compact if AUTO_COMPACT is on and the trigger is
    reached. Never raises (the append stands whatever happens here); returns what happened,
    or None when auto compaction is off.

    Inside a caller's transaction the compaction waits for it to commit (reason
    ``deferred``).
    """
    if not ctxsum_settings.AUTO_COMPACT:
        return None
    db = write_db(conversation)
    if transaction.get_connection(using=db).in_atomic_block:
        transaction.on_commit(partial(_autocompact, conversation), using=db)
        return AutoCompaction(compacted=False, reason=Reason.DEFERRED)
    return _autocompact(conversation)


def _autocompact(conversation: Conversation) -> AutoCompaction:
    try:
        result = conversation_compact(conversation=conversation)
    except SummarizerError as error:
        reason = failure_reason(error)
        return AutoCompaction(compacted=False, reason=reason, detail=str(SUMMARIZER_FAILED))
    except Conversation.DoesNotExist:
        return AutoCompaction(compacted=False, reason=Reason.CONFLICT, detail=str(DELETED))
    except Exception as error:
        logger.exception("Automatic compaction of conversation %s failed.", conversation.pk)
        return AutoCompaction(compacted=False, reason=Reason.ERROR, detail=type(error).__name__)
    return AutoCompaction(
        compacted=result.compacted,
        reason=result.reason,
        summary_version=result.summary.version if result.summary else None,
        over_trigger=result.over_trigger,
    )
