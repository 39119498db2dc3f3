"""Key facts in the core's commits (``ctxsum.hooks``): a summary's facts merged, a reverted
version's undone, a redacted message's taken back, each inside the commit's transaction.

A commit that changes facts first locks the conversations that show them (``facts_lock``:
a subject's, in primary-key order), then its own row; one that changes none (a summary
without facts, a version that wrote none, a message no fact cites) locks its own row only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxsum.hooks import (
    CommitHook,
    Event,
    LockAgain,
    MessageRedacted,
    SummaryCommitted,
    SummaryReverted,
)
from ctxsum.models import Conversation
from ctxsum.services.fact_merge import (
    facts_cite,
    facts_commit,
    facts_forget,
    facts_lock,
    facts_revert,
    facts_to_revert,
)


@dataclass(frozen=True)
class Shown:
    """The subject a commit saw, and its conversations, locked (empty: none named)."""

    subject: str
    conversations: list[Conversation]


class FactsHook(CommitHook):
    def concerns(self, conversation: Conversation, event: Event, *, db: str) -> bool:
        if isinstance(event, SummaryCommitted):
            return bool(event.facts)
        if isinstance(event, SummaryReverted):
            return facts_to_revert(event.target)
        return facts_cite(conversation, event.seq, db=db)

    def lock(self, conversation: Conversation, *, db: str) -> Shown:
        return Shown(conversation.subject, facts_lock(conversation, db=db))

    def apply(self, event: Event, *, locked: Conversation, held: Any) -> None:
        shown: Shown = held
        conversations, subject = shown.conversations, shown.subject
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
