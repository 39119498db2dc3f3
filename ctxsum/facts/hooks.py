"""Key facts in the core's commits (``ctxsum.hooks``): a summary's facts merged, a reverted
version's undone, a redacted message's taken back, then which facts the changed context
carries checked and the block recounted, inside the commit's transaction and in the lock
order of ``ctxsum.facts.block``; a block recounted when its inputs change.
"""

from __future__ import annotations

from typing import Any

from ctxsum.facts.block import (
    context_text,
    facts_check,
    facts_count,
    facts_recount,
    facts_seen,
    own_block,
)
from ctxsum.facts.merge import (
    facts_cite,
    facts_commit,
    facts_forget,
    facts_lock,
    facts_revert,
    facts_to_revert,
)
from ctxsum.facts.models import CarriedFact
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

# What a conversation's facts block depends on: its facts, their encoding, its budget.
BLOCK_INPUTS = frozenset({"subject", "model", "trigger", "max_context_tokens"})


class FactsHook(CommitHook):
    def concerns(self, conversation: Conversation, event: Event, *, db: str) -> bool:
        if isinstance(event, SummaryCommitted):
            return bool(event.facts) or facts_seen(conversation)
        if isinstance(event, SummaryReverted):
            return facts_to_revert(event.target) or facts_seen(conversation)
        if isinstance(event, ConversationChanged):
            return bool(BLOCK_INPUTS & event.given)
        carried = CarriedFact.objects.using(db).filter(conversation=conversation)
        return facts_cite(conversation, event.seq, db=db) or carried.exists()

    def lock(self, conversation: Conversation, event: Event, *, db: str) -> Any:
        if isinstance(event, ConversationChanged):
            if "subject" in event.given:
                owner_lock(db=db, owner_id=conversation.owner_id)
            return None
        # The subject the commit saw, and its conversations locked (none: no subject or no
        # facts to write).
        writes = not isinstance(event, SummaryCommitted) or bool(event.facts)
        return conversation.subject, facts_lock(conversation, db=db) if writes else []

    def apply(self, event: Event, *, locked: Conversation, held: Any) -> None:
        if isinstance(event, ConversationChanged):
            if BLOCK_INPUTS & event.changed:
                facts_recount([locked])
            return
        subject, conversations = held
        if isinstance(event, SummaryCommitted):
            assert event.summary is not None
            text = context_text(locked, event.summary.text)
            facts_commit(
                locked=locked,
                shown=conversations,
                subject=subject,
                summary=event.summary,
                facts=event.facts,
                room=event.room,
                text=text,
            )
        elif isinstance(event, SummaryReverted):
            previous = event.target.previous if event.target.previous_id else None
            text = context_text(locked, previous.text if previous else "")
            facts_revert(locked=locked, shown=conversations, subject=subject, target=event.target)
        else:
            if locked.subject != subject:
                raise LockAgain  # the subject whose conversations were locked changed
            facts_forget(locked=locked, shown=conversations, subject=subject, seq=event.seq)
            text = context_text(locked)
        checked = facts_check(locked, text, add=not isinstance(event, MessageRedacted))
        own_block(locked, facts_count(locked, checked))
