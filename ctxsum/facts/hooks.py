"""Key facts in the core's commits (``ctxsum.hooks``): a summary's facts merged, a reverted
version's undone, a redacted message's taken back, a conversation's facts block recounted
when its subject or model changes, each inside the commit's transaction and in the lock
order of ``ctxsum.facts.block``.
"""

from __future__ import annotations

from typing import Any

from ctxsum.facts.block import facts_recount
from ctxsum.facts.merge import (
    facts_cite,
    facts_commit,
    facts_forget,
    facts_lock,
    facts_revert,
    facts_to_revert,
)
from ctxsum.facts.services import owner_lock
from ctxsum.hooks import (
    CommitHook,
    ConversationChanged,
    Event,
    LockAgain,
    MessageRedacted,
    SummaryCommitted,
    SummaryReverted,
)
from ctxsum.models import Conversation

# What a conversation's facts block depends on: which facts it shows, and their encoding.
BLOCK_INPUTS = frozenset({"subject", "model"})


class FactsHook(CommitHook):
    def concerns(self, conversation: Conversation, event: Event, *, db: str) -> bool:
        if isinstance(event, SummaryCommitted):
            return bool(event.facts)
        if isinstance(event, SummaryReverted):
            return facts_to_revert(event.target)
        if isinstance(event, ConversationChanged):
            return bool(BLOCK_INPUTS & event.given)
        return facts_cite(conversation, event.seq, db=db)

    def lock(self, conversation: Conversation, event: Event, *, db: str) -> Any:
        if isinstance(event, ConversationChanged):
            if "subject" in event.given:
                owner_lock(db=db, owner_id=conversation.owner_id)
            return None
        # The subject the commit saw, and its conversations, locked (none: no subject).
        return conversation.subject, facts_lock(conversation, db=db)

    def apply(self, event: Event, *, locked: Conversation, held: Any) -> None:
        if isinstance(event, ConversationChanged):
            if BLOCK_INPUTS & event.changed:
                facts_recount([locked])
            return
        subject, conversations = held
        if isinstance(event, SummaryCommitted):
            assert event.summary is not None
            facts_commit(
                locked=locked,
                shown=conversations,
                subject=subject,
                summary=event.summary,
                facts=event.facts,
                room=event.room,
            )
        elif isinstance(event, SummaryReverted):
            facts_revert(locked=locked, shown=conversations, subject=subject, target=event.target)
        elif isinstance(event, MessageRedacted):
            if locked.subject != subject:
                raise LockAgain  # the subject whose conversations were locked changed
            facts_forget(locked=locked, shown=conversations, subject=subject, seq=event.seq)
