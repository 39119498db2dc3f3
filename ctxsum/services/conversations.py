"""Creating, changing and deleting conversations."""

from __future__ import annotations

import copy
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ctxsum import policy as policy_rules
from ctxsum.hooks import ConversationChanged, commit_apply, commit_lock, concerned
from ctxsum.models import Conversation, Message
from ctxsum.selectors import effective_policy
from ctxsum.services.autocompact import Schedule, autocompact_schedule, conversation_autocompact
from ctxsum.services.messages import messages_clean, messages_count, messages_insert
from ctxsum.services.transactions import write_db
from ctxsum.threads import database_sync_to_async
from ctxsum.validation import NOT_A_STRING, UNSET, Unset, unstorable

NOT_AN_OBJECT = _("Must be an object.")
TOO_LONG = _("Must be at most {limit} characters.")
SYSTEM_AND_LEADING = _("Give the system prompt either as `system` or as a leading system message.")
POLICY_FIELDS = ("trigger", "keep", "max_context_tokens")
MAX_SUBJECT_CHARS = 200
SUBJECT_SPACES = _("Must not start or end with whitespace.")
SUBJECT_CHARACTERS = _("Must not contain a slash or a control character.")
SUBJECT_DOTS = _("Must not be “.” or “..”.")


def policy_clean(*, trigger: Any, keep: Any, max_context_tokens: Any = None) -> None:
    """Check a conversation's policy overrides; raise ValidationError naming the field."""
    values = effective_policy(trigger=trigger, keep=keep, max_context_tokens=max_context_tokens)
    try:
        policy_rules.parse_policy(**values)
    except policy_rules.PolicyError as error:
        raise ValidationError({error.field: [str(error)]}) from error


def subject_problem(subject: Any) -> str | None:
    """Why ``subject`` cannot name a subject (one URL path segment), or None."""
    if not isinstance(subject, str):
        return str(NOT_A_STRING)
    if problem := unstorable(subject):
        return problem
    if len(subject) > MAX_SUBJECT_CHARS:
        return TOO_LONG.format(limit=MAX_SUBJECT_CHARS)
    if subject != subject.strip():
        return str(SUBJECT_SPACES)
    if any(char == "/" or unicodedata.category(char) == "Cc" for char in subject):
        return str(SUBJECT_CHARACTERS)
    if subject in (".", ".."):
        return str(SUBJECT_DOTS)
    return None


def fields_clean(**fields: Any) -> None:
    """Check the fields as the columns take them; raise ValidationError naming each bad one."""
    errors: dict[str, list[str]] = {}
    for name, value in fields.items():
        if problem := unstorable(value):
            errors[name] = [problem]
        elif name == "metadata":
            if not isinstance(value, Mapping):
                errors[name] = [str(NOT_AN_OBJECT)]
        elif not isinstance(value, str):
            errors[name] = [str(NOT_A_STRING)]
        elif len(value) > (limit := _max_length(name)):
            errors[name] = [TOO_LONG.format(limit=limit)]
        elif name == "subject" and (problem := subject_problem(value)):
            errors[name] = [problem]
    if errors:
        raise ValidationError(errors)


def _max_length(name: str) -> int:
    field = Conversation._meta.get_field(name)
    assert isinstance(field, models.CharField) and field.max_length is not None
    return field.max_length


def _copy(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A deep copy of a checked JSON object: the caller's dicts are never shared."""
    return None if value is None else copy.deepcopy(dict(value))


def _system_message(system: Any) -> dict[str, Any]:
    if not isinstance(system, str):
        raise ValidationError({"system": [str(NOT_A_STRING)]})
    if problem := unstorable(system):
        raise ValidationError({"system": [problem]})
    return {"role": "system", "content": system}


def conversation_create(
    *,
    owner: Any,
    title: str = "",
    system: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    model: str = "",
    subject: str = "",
    trigger: Mapping[str, int] | None = None,
    keep: Mapping[str, int] | None = None,
    max_context_tokens: int | None = None,
    messages: Sequence[Any] | None = None,
) -> Conversation:
    """Create a conversation, with its system prompt and first messages if given, all or
    nothing; first messages are compacted as after any append."""
    fields_clean(
        title=title, model=model, metadata={} if metadata is None else metadata, subject=subject
    )
    policy_clean(trigger=trigger, keep=keep, max_context_tokens=max_context_tokens)
    first = messages[0] if isinstance(messages, list | tuple) and messages else None
    leading: list[dict[str, Any]] = []
    if system is not None:
        if isinstance(first, Mapping) and first.get("role") == "system":
            raise ValidationError({"system": [str(SYSTEM_AND_LEADING)]})
        leading = messages_clean([_system_message(system)])
    conversation = Conversation(
        owner=owner,
        title=title,
        metadata=_copy(metadata) or {},
        model=model,
        subject=subject,
        trigger=_copy(trigger),
        keep=_copy(keep),
        max_context_tokens=max_context_tokens,
    )
    # The client's messages are checked on their own, so errors carry the indices it sent.
    cleaned = messages_clean(messages) if messages not in (None, [], ()) else []
    counts = messages_count(conversation, leading + cleaned)
    db = write_db(conversation)
    # The apps see a subject (ctxsum.facts counts its block once the messages are in).
    fields = frozenset({"subject"} if subject else ())
    named = ConversationChanged(given=fields, changed=fields)
    hooks = concerned(conversation, named, db=db)
    with transaction.atomic(using=db):
        held = commit_lock(conversation, hooks, named, db=db)
        conversation.save(using=db)
        if leading or cleaned:
            messages_insert(conversation, cleaned, counts, leading=leading[0] if leading else None)
        commit_apply(held, named, locked=conversation)
        schedule = autocompact_schedule(conversation) if cleaned else Schedule.OFF
    conversation_autocompact(conversation=conversation, schedule=schedule)
    return conversation


def _replace_system(conversation: Conversation, system: str) -> None:
    """Retire the leading system message (marked replaced) and put a new one first; the
    same text again changes nothing. The caller holds the row lock."""
    cleaned = messages_clean([_system_message(system)])
    counts = messages_count(conversation, cleaned)
    rows = Message.objects.using(conversation._state.db).filter(conversation=conversation)
    old = rows.filter(is_leading=True, replaced_at__isnull=True).first()
    if old is not None and old.role == "system" and old.content == system:
        return
    if old is not None:
        old.replaced_at = timezone.now()
        old.save(update_fields=["replaced_at"])
        conversation.active_message_count -= 1
        conversation.active_tokens -= old.token_count
    messages_insert(conversation, [], counts, leading=cleaned[0])


def conversation_update(
    *,
    conversation: Conversation,
    title: str | Unset = UNSET,
    metadata: Mapping[str, Any] | Unset = UNSET,
    model: str | Unset = UNSET,
    subject: str | Unset = UNSET,
    system: str | Unset = UNSET,
    trigger: Mapping[str, int] | Unset | None = UNSET,
    keep: Mapping[str, int] | Unset | None = UNSET,
    max_context_tokens: int | Unset | None = UNSET,
) -> Conversation:
    """Change what is given: title, metadata, model, subject, policy overrides (None
    resets one to the settings' default), or replace the system prompt. Saves only the
    columns that changed, bumping ``revision``; ``conversation`` is brought up to date."""
    given = {
        name: value
        for name, value in {
            "title": title,
            "metadata": metadata,
            "model": model,
            "subject": subject,
            "trigger": trigger,
            "keep": keep,
            "max_context_tokens": max_context_tokens,
        }.items()
        if value is not UNSET
    }
    checked = ("title", "model", "metadata", "subject")
    fields_clean(**{name: given[name] for name in checked if name in given})
    for name in ("metadata", "trigger", "keep"):
        value = given.get(name)
        if isinstance(value, Mapping):
            given[name] = _copy(value)
    db = write_db(conversation)
    event = ConversationChanged(given=frozenset(given))
    hooks = concerned(conversation, event, db=db)
    with transaction.atomic(using=db):
        held = commit_lock(conversation, hooks, event, db=db)  # before the row's lock
        locked = Conversation.objects.using(db).select_for_update().get(pk=conversation.pk)
        if any(name in given for name in POLICY_FIELDS):
            # Checked against the locked row: a concurrent change of another part of the
            # policy must not slip in between check and write.
            policy_clean(**{name: given.get(name, getattr(locked, name)) for name in POLICY_FIELDS})
        changed = [name for name, value in given.items() if getattr(locked, name) != value]
        for name in changed:
            setattr(locked, name, given[name])
        revision = locked.revision
        # _replace_system and the hooks save the counters and move revision themselves.
        if system is not UNSET:
            _replace_system(locked, system)
        commit_apply(held, replace(event, changed=frozenset(changed)), locked=locked)
        if changed:
            locked.revision += int(locked.revision == revision)
            locked.save(update_fields=[*changed, "revision", "updated_at"])
    conversation.update_from(locked)
    return conversation


def conversation_restart(*, conversation: Conversation) -> Conversation:
    """A new conversation of the same owner with the same title, metadata, model, subject,
    policy and leading system message; ``conversation`` is left whole. How the agent
    framework integrations clear a session without deleting history a summary covers."""
    db = write_db(conversation)
    leading = (
        Message.objects.using(db)
        .filter(conversation=conversation, is_leading=True, replaced_at__isnull=True)
        .first()
    )
    return conversation_create(
        owner=conversation.owner,
        title=conversation.title,
        metadata=conversation.metadata,
        model=conversation.model,
        subject=conversation.subject,
        trigger=conversation.trigger,
        keep=conversation.keep,
        max_context_tokens=conversation.max_context_tokens,
        messages=[leading.as_openai()] if leading is not None else None,
    )


async def aconversation_restart(*, conversation: Conversation) -> Conversation:
    """``conversation_restart`` for async code, run in the thread that serves the database."""
    restarted: Conversation = await database_sync_to_async(conversation_restart)(
        conversation=conversation
    )
    return restarted


def conversation_delete(*, conversation: Conversation) -> None:
    """Delete a conversation with its messages, summaries and attempts, behind the row lock
    (a commit in flight finishes first)."""
    db = write_db(conversation)
    with transaction.atomic(using=db):
        locked = Conversation.objects.using(db).select_for_update().filter(pk=conversation.pk)
        if locked.exists():
            locked.delete()
