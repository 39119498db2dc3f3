"""Creating, changing and deleting conversations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from ctxsum import policy as policy_rules
from ctxsum.conf import ctxsum_settings
from ctxsum.models import Conversation, Message
from ctxsum.services.compaction import conversation_autocompact
from ctxsum.services.messages import (
    message_rows,
    messages_clean,
    messages_count,
    messages_store,
    tool_results_check,
)

SYSTEM_TYPE = "Must be a string."
SYSTEM_AND_LEADING = "Give the system prompt either as `system` or as a leading system message."
UPDATABLE = ("title", "metadata", "model", "trigger", "keep", "max_context_tokens")
POLICY_FIELDS = ("trigger", "keep", "max_context_tokens")


def policy_clean(*, trigger: Any, keep: Any, max_context_tokens: Any = None) -> None:
    """Check a conversation's policy overrides against each other and the defaults; raise
    ValidationError naming the field."""
    try:
        policy_rules.parse_policy(
            ctxsum_settings.TRIGGER if trigger is None else trigger,
            ctxsum_settings.KEEP if keep is None else keep,
            ctxsum_settings.MAX_CONTEXT_TOKENS
            if max_context_tokens is None
            else max_context_tokens,
        )
    except policy_rules.PolicyError as error:
        raise ValidationError({error.field: [str(error)]}) from error


def _system_message(system: Any) -> dict[str, Any]:
    if not isinstance(system, str):
        raise ValidationError({"system": [SYSTEM_TYPE]})
    return {"role": "system", "content": system}


def conversation_create(
    *,
    owner: Any,
    title: str = "",
    system: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    model: str = "",
    trigger: Mapping[str, int] | None = None,
    keep: Mapping[str, int] | None = None,
    max_context_tokens: int | None = None,
    messages: Sequence[Any] | None = None,
) -> Conversation:
    """Create a conversation, with its system prompt and first messages if given, in one
    transaction: all or nothing. With AUTO_COMPACT, a compaction follows once that has
    committed, as after any append; its failure never undoes the creation."""
    policy_clean(trigger=trigger, keep=keep, max_context_tokens=max_context_tokens)
    batch = list(messages or [])
    leading: list[dict[str, Any]] = []
    if system is not None:
        if batch and isinstance(batch[0], Mapping) and batch[0].get("role") == "system":
            raise ValidationError({"system": [SYSTEM_AND_LEADING]})
        leading = messages_clean([_system_message(system)])
    conversation = Conversation(
        owner=owner,
        title=title,
        metadata=dict(metadata or {}),
        model=model,
        trigger=trigger,
        keep=keep,
        max_context_tokens=max_context_tokens,
    )
    # The client's messages are checked on their own, so errors carry the indices it sent.
    cleaned = messages_clean(batch) if batch else []
    counts = messages_count(conversation, leading + cleaned)
    with transaction.atomic():
        conversation.save()
        if cleaned:
            tool_results_check(conversation, cleaned)
        if leading or cleaned:
            messages_store(conversation, message_rows(conversation, leading + cleaned, counts))
    # First messages are an append too: AUTO_COMPACT applies once they have committed.
    compaction = conversation_autocompact(conversation=conversation) if cleaned else None
    if compaction is not None and compaction.compacted:
        conversation.refresh_from_db()
    return conversation


def _replace_system(conversation: Conversation, system: str) -> bool:
    """Retire the leading system message (it stays in the transcript, marked replaced) and
    put a new one first in the context; the same text again changes nothing. The caller
    holds the row lock. Returns whether the context changed (and revision moved)."""
    cleaned = messages_clean([_system_message(system)])
    counts = messages_count(conversation, cleaned)
    old = Message.objects.filter(
        conversation=conversation, is_leading=True, replaced_at__isnull=True
    ).first()
    if old is not None and old.role == "system" and old.content == system:
        return False
    if old is not None:
        old.replaced_at = timezone.now()
        old.save(update_fields=["replaced_at"])
        conversation.active_message_count -= 1
        conversation.active_tokens -= old.token_count
    (row,) = message_rows(conversation, cleaned, counts)
    row.is_leading = True
    messages_store(conversation, [row])
    return True


def conversation_update(
    *, conversation: Conversation, system: str | None = None, **fields: Any
) -> Conversation:
    """Change title, metadata, model, policy overrides, or replace the system prompt.

    Bumps ``revision`` when anything changed; a request that changes nothing writes
    nothing. Returns the updated conversation.
    """
    unknown = set(fields) - set(UPDATABLE)
    if unknown:
        raise TypeError(f"conversation_update() got unexpected fields {sorted(unknown)}")
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        if any(name in fields for name in POLICY_FIELDS):
            # Checked against the locked row: a concurrent change of another part of the
            # policy must not slip in between check and write.
            policy_clean(
                **{name: fields.get(name, getattr(locked, name)) for name in POLICY_FIELDS}
            )
        changed = [field for field, value in fields.items() if getattr(locked, field) != value]
        for field in changed:
            setattr(locked, field, fields[field])
        # _replace_system saves the counters and moves revision itself.
        replaced = system is not None and _replace_system(locked, system)
        if changed:
            if not replaced:
                locked.revision += 1
            locked.save()
    return locked


def conversation_delete(*, conversation: Conversation) -> None:
    """Delete a conversation with its messages, summaries and attempts.

    The row lock comes first: an append or a compaction commit in flight finishes before
    the delete collects the rows, and any that comes after finds the conversation gone."""
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().filter(pk=conversation.pk)
        if locked.exists():
            locked.delete()
