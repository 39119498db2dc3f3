"""Redacting a message: its words are erased, its place in the conversation is not. Every
summary version covering it is withheld in the same transaction and rebuilt once the
redaction commits; the commit hooks take back what the apps derived from it
(docs/architecture.md, "Rebuild and redaction" and invariant f).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from ctxsum import tokens
from ctxsum.hooks import (
    LockAgain,
    MessageRedacted,
    commit_apply,
    commit_lock,
    concerned,
    newly_concerned,
)
from ctxsum.models import Conversation, Message, Summary
from ctxsum.services.autocompact import withheld_rebuild
from ctxsum.services.summaries import summary_size
from ctxsum.services.transactions import write_db

REDACTED = "[redacted]"
# The text of a summary version that covered a redacted message; the shorter ones stand in
# for a summary that was shorter than the notice, so the context never grows.
WITHHELD = "[Summary withheld after a redaction.]"
WITHHELD_SHORTER = ("[withheld]", "…")


def redacted(message: Message) -> dict[str, Any]:
    """The fields of ``message`` once redacted."""
    calls = [
        {**call, "function": {**call["function"], "arguments": "{}"}}
        for call in message.tool_calls or ()
    ]
    # An assistant message that only called tools keeps its null content.
    content = None if message.content is None and calls else REDACTED
    return {"content": content, "tool_calls": calls or None, "extra": {}}


def message_redact(*, conversation: Conversation, seq: int) -> Message:
    """Redact the message at ``seq``; redacting it again changes nothing. Raises
    Message.DoesNotExist or Conversation.DoesNotExist; ``conversation`` is brought up to date."""
    db = write_db(conversation)
    # The hooks are asked without a lock, from the row; one concerned meanwhile is found
    # under the lock, and the commit starts over with it locking first.
    event = MessageRedacted(seq=seq)
    hooks: frozenset[str] = frozenset()
    while True:
        row = Conversation.objects.using(db).get(pk=conversation.pk)
        hooks |= concerned(row, event, db=db)
        try:
            locked, message = _commit(row, event, db=db, hooks=hooks)
        except LockAgain:
            continue  # the hooks concerned so far stay concerned: each round adds, or ends
        conversation.update_from(locked)
        return message


def _commit(
    row: Conversation, event: MessageRedacted, *, db: str, hooks: frozenset[str]
) -> tuple[Conversation, Message]:
    with transaction.atomic(using=db):
        held = commit_lock(row, hooks, event, db=db)  # before the row's lock
        locked = Conversation.objects.using(db).select_for_update().get(pk=row.pk)
        message = Message.objects.using(db).get(conversation=locked, seq=event.seq)
        if message.redacted_at is None:
            if newly_concerned(locked, event, held, db=db):
                raise LockAgain
            _redact(locked, message)
            counters = (locked.facts_tokens, locked.active_tokens)
            commit_apply(held, event, locked=locked)
            if (locked.facts_tokens, locked.active_tokens) != counters:
                locked.save(update_fields=["facts_tokens", "active_tokens", "updated_at"])
    return locked, message


def _redact(locked: Conversation, message: Message) -> None:
    before = message.token_count
    for name, value in redacted(message).items():
        setattr(message, name, value)
    message.token_count = tokens.count_message(message.as_openai(), model=locked.model or None)
    message.redacted_at = timezone.now()
    message.save(update_fields=["content", "tool_calls", "extra", "token_count", "redacted_at"])
    if message.summary_id is not None:
        locked.archived_tokens += message.token_count - before
    elif message.replaced_at is None:
        locked.active_tokens += message.token_count - before  # it is in the context
    locked.revision += 1
    covering = Summary.objects.using(locked._state.db).filter(
        conversation=locked, from_seq__lte=message.seq, to_seq__gte=message.seq
    )
    locked.active_tokens += _withhold(locked, covering)
    locked.save(update_fields=["active_tokens", "archived_tokens", "revision", "updated_at"])


def _withhold(locked: Conversation, covering: QuerySet[Summary]) -> int:
    """Withhold the text of every version in ``covering`` (a notice no longer than the
    shortest, and no coverage or skipped facts, which quote the messages); returns how many
    tokens the active summary's message changed."""
    versions = list(covering.values_list("active", "token_count"))
    if not versions:
        return 0
    shortest = min(count for _active, count in versions)
    for notice in (WITHHELD, *WITHHELD_SHORTER):
        size = summary_size(notice, locked)
        if size <= shortest:
            break
    covering.update(
        text=notice, token_count=size, coverage_facts=None, facts_skipped="", covers_redacted=True
    )
    change = [size - count for active, count in versions if active]
    if change:
        db = write_db(locked)
        transaction.on_commit(partial(withheld_rebuild, str(locked.pk), db), using=db)
    return sum(change)
