"""Taking back the newest message (an agent framework's "undo"), without touching history
a summary covers: only the newest message of the conversation goes, and only when it is in
the active context's body and no summary version, active or reverted, ever covered it
(docs/architecture.md, "Taking a message back"). ``seq`` stays gapless: the next append
takes the freed number.
"""

from __future__ import annotations

from django.db import transaction

from ctxsum.models import Conversation, Message, Summary
from ctxsum.services.messages import COUNTER_FIELDS
from ctxsum.services.transactions import write_db
from ctxsum.threads import database_sync_to_async


def message_pop(*, conversation: Conversation) -> Message | None:
    """Delete the conversation's newest message and return it (no longer saved), or None
    when there is none to take back: the newest is the leading system message, archived,
    replaced, or covered by a summary version. Raises Conversation.DoesNotExist;
    ``conversation`` is brought up to date."""
    db = write_db(conversation)
    with transaction.atomic(using=db):
        locked = Conversation.objects.using(db).select_for_update().get(pk=conversation.pk)
        newest = _poppable(locked)
        if newest is not None:
            # Its tool calls' index rows go with it (CASCADE); a compaction in flight that
            # read it conflicts at its commit (compaction._archive counts the rows it read).
            Message.objects.using(db).filter(pk=newest.pk).delete()
            locked.next_seq -= 1
            locked.message_count -= 1
            locked.active_message_count -= 1
            locked.active_tokens -= newest.token_count
            locked.revision += 1
            locked.save(update_fields=COUNTER_FIELDS)
    conversation.update_from(locked)
    return newest


async def amessage_pop(*, conversation: Conversation) -> Message | None:
    """``message_pop`` for async code, run in the thread that serves the database."""
    popped: Message | None = await database_sync_to_async(message_pop)(conversation=conversation)
    return popped


def _poppable(locked: Conversation) -> Message | None:
    """The newest message, if it may be taken back; the caller holds the row lock."""
    if locked.next_seq == 0:
        return None
    db = locked._state.db
    newest = Message.objects.using(db).filter(conversation=locked, seq=locked.next_seq - 1).first()
    if newest is None or newest.is_leading or newest.summary_id is not None:
        return None
    covered = Summary.objects.using(db).filter(conversation=locked, to_seq__gte=newest.seq)
    return None if covered.exists() else newest
