"""A person's writes to key facts: adding one, changing its value, key or pin, deleting it.

The summarizer writes facts during compaction (``ctxsum.facts.merge``); these are the
writes of a person, over REST or in the admin. Each is one transaction in the lock order
of ``ctxsum.facts.block`` (the owner's row only for a subject's fact), which recounts each
conversation's facts block and moves its ``revision``.
A person's write marks the fact ``changed_by = "person"``: the model never overwrites it
again, and proposes instead (``proposed_value``). docs/architecture.md, "Key facts", says why
the owner's row is locked and what each write keeps.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connections, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ctxsum.facts.block import conversations_lock, facts_recount, line_tokens
from ctxsum.facts.models import Fact
from ctxsum.models import Conversation
from ctxsum.services.conversations import TOO_LONG, subject_problem
from ctxsum.services.transactions import write_db
from ctxsum.summarizers.facts import MAX_KEY_CHARS, MAX_VALUE_CHARS, normalize_key
from ctxsum.validation import NOT_A_STRING, UNSET, Unset, unstorable

# The Python API of key facts (docs/guide/python-api.md).
__all__ = ["fact_add", "fact_change", "fact_delete"]

logger = logging.getLogger("ctxsum.facts")

BLANK = _("Must not be blank.")
NOT_ONE_LINE = _("Must be one line (no line breaks).")
KEY_WITHOUT_WORD = _("Must contain a letter or a digit.")
NOT_A_BOOLEAN = _("Must be true or false.")
SUBJECT_REQUIRED = _("A fact belongs to a conversation or to a subject: give one.")
SUBJECT_AND_CONVERSATION = _(
    "A fact belongs to a conversation or to a subject, not both: a conversation's fact has "
    "no subject."
)
DUPLICATE_CONVERSATION_KEY = _("This conversation already has a fact with the key {key!r}.")
DUPLICATE_SUBJECT_KEY = _("The subject {subject!r} already has a fact with the key {key!r}.")

# What a person's change may write on the fact's row.
CHANGED_FIELDS = (
    "key",
    "value",
    "pinned",
    "summary",
    "proposed_value",
    "proposed_by",
    "token_count",
    "changed_by",
    "changed_by_user",
    "confirmed_at",
    "updated_at",
)


def _text(value: Any, *, limit: int, one_line: bool) -> tuple[str, str | None]:
    """``value`` stripped, and what is wrong with it (or None)."""
    if not isinstance(value, str):
        return "", str(NOT_A_STRING)
    if problem := unstorable(value):
        return "", problem
    text = value.strip()
    if not text:
        return "", str(BLANK)
    if len(text) > limit:
        return "", TOO_LONG.format(limit=limit)
    # A key is one line of the facts block; the text is stripped, so a break is inside it.
    if one_line and len(text.splitlines()) > 1:
        return "", str(NOT_ONE_LINE)
    return text, None


def _key(value: Any) -> tuple[str, str | None]:
    """``value`` as a key, normalized like the summarizer's (``summarizers.facts.normalize_key``),
    and what is wrong with it (or None)."""
    text, problem = _text(value, limit=MAX_KEY_CHARS, one_line=True)
    if problem:
        return "", problem
    key = normalize_key(text)
    if not key:
        return "", str(KEY_WITHOUT_WORD)
    if len(key) > MAX_KEY_CHARS:  # a case fold may lengthen it: "ß" is "ss"
        return "", TOO_LONG.format(limit=MAX_KEY_CHARS)
    return key, None


def facts_clean(**fields: Any) -> dict[str, Any]:
    """Check ``key``, ``value`` and ``pinned`` (whichever are given); return them as they
    are stored (value stripped, key normalized: ``Order ID`` is ``order_id``) or raise
    ValidationError naming every bad field."""
    cleaned: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    for name, value in fields.items():
        if name == "key":
            cleaned[name], problem = _key(value)
        elif name == "value":
            cleaned[name], problem = _text(value, limit=MAX_VALUE_CHARS, one_line=False)
        elif name == "pinned":
            cleaned[name] = value
            problem = None if isinstance(value, bool) else str(NOT_A_BOOLEAN)
        else:
            raise TypeError(f"facts_clean() got an unknown field {name!r}")
        if problem:
            errors[name] = [problem]
    if errors:
        raise ValidationError(errors)
    return cleaned


def owner_lock(*, db: str, owner_id: Any) -> None:
    """Lock the owner's user row, inside the caller's transaction, before any conversation:
    subject facts and conversations' subjects change one at a time per owner, so that a
    conversation that starts naming a subject never misses a fact written meanwhile.

    FOR NO KEY UPDATE, not FOR UPDATE: a transaction that inserts a row pointing to the
    user (a compaction's new fact, a chat turn's call count) takes FOR KEY SHARE on this row
    when PostgreSQL checks the foreign key at its commit, and may hold the subject's
    conversations meanwhile. FOR UPDATE would make it wait here while this transaction
    waits for those conversations; FOR NO KEY UPDATE does not conflict with FOR KEY SHARE,
    and still with itself, which is what orders the owner's writes."""
    users = get_user_model()._default_manager.using(db)
    no_key = connections[db].features.has_select_for_no_key_update
    list(users.select_for_update(no_key=no_key).filter(pk=owner_id).values_list("pk", flat=True))


def _lock(db: str, fact: Fact) -> list[Conversation]:
    """The locks a write to ``fact`` takes, in their order; the conversations that show it."""
    if fact.conversation_id is None:  # a subject's fact; a conversation's own has no subject
        owner_lock(db=db, owner_id=fact.owner_id)
    return conversations_lock(
        db=db, owner_id=fact.owner_id, subject=fact.subject, conversation_id=fact.conversation_id
    )


def _model(fact: Fact, locked: list[Conversation]) -> str | None:
    """The model of the conversation whose own fact ``fact`` is (None for a subject's)."""
    return next((c.model or None for c in locked if c.pk == fact.conversation_id), None)


def _duplicate(fact: Fact) -> ValidationError:
    own = fact.conversation_id is not None
    text = DUPLICATE_CONVERSATION_KEY if own else DUPLICATE_SUBJECT_KEY
    return ValidationError({"key": [text.format(subject=fact.subject, key=fact.key)]})


def _has_key(db: str, fact: Fact) -> bool:
    """Whether another fact of ``fact``'s conversation or subject has its key."""
    same = Fact.objects.using(db).filter(key=fact.key).exclude(pk=fact.pk)
    if fact.conversation_id is not None:
        return same.filter(conversation_id=fact.conversation_id).exists()
    return same.of_subject(fact.owner_id, fact.subject).exists()


def _save(db: str, fact: Fact, **kwargs: Any) -> None:
    """Save ``fact``; a key taken meanwhile (a writer this one's locks did not order) is
    the same error as one taken before."""
    try:
        with transaction.atomic(using=db):
            fact.save(using=db, **kwargs)
    except IntegrityError as error:
        if _has_key(db, fact):
            raise _duplicate(fact) from error
        raise


def fact_add(
    *,
    user: Any,
    key: Any,
    value: Any,
    pinned: Any = False,
    conversation: Conversation | None = None,
    subject: Any = "",
) -> Fact:
    """Add a person's fact to ``conversation``, or to ``subject`` (a subject's fact is
    ``user``'s, shared by all of their conversations naming the subject; it may exist
    before any does). Raises ValidationError naming the field (``key``, ``value``,
    ``pinned``, ``subject``), nothing stored then; Conversation.DoesNotExist when the
    conversation is gone."""
    cleaned = facts_clean(key=key, value=value, pinned=pinned)
    if conversation is not None and subject != "":
        raise ValidationError({"subject": [str(SUBJECT_AND_CONVERSATION)]})
    if conversation is None:
        problem = str(SUBJECT_REQUIRED) if subject == "" else subject_problem(subject)
        if problem:
            raise ValidationError({"subject": [problem]})
    fact = Fact(
        owner_id=conversation.owner_id if conversation is not None else user.pk,
        conversation=conversation,
        subject=subject if conversation is None else "",
        changed_by=Fact.ChangedBy.PERSON,
        changed_by_user=user,
        confirmed_at=timezone.now(),
        **cleaned,
    )
    db = write_db(conversation)
    with transaction.atomic(using=db):
        locked = _lock(db, fact)
        if conversation is not None and not locked:
            raise Conversation.DoesNotExist("The conversation was deleted.")
        if _has_key(db, fact):
            raise _duplicate(fact)
        fact.token_count = line_tokens(fact, model=_model(fact, locked))
        _save(db, fact, force_insert=True)
        facts_recount(locked, changed=True)
    if conversation is not None:
        conversation.update_from(locked[0])
    return fact


def fact_change(
    *,
    fact: Fact,
    user: Any,
    value: Any | Unset = UNSET,
    key: Any | Unset = UNSET,
    pinned: Any | Unset = UNSET,
) -> Fact:
    """A person changes ``fact``: any of its value, key and pin. Writing a value settles
    the model's proposal (to accept it, write ``fact.proposed_value``). Nothing given,
    nothing written. Raises ValidationError naming the field, nothing stored then;
    Fact.DoesNotExist when the fact was deleted meanwhile. ``fact`` is brought up to date
    and returned."""
    given = {"value": value, "key": key, "pinned": pinned}
    cleaned = facts_clean(**{name: new for name, new in given.items() if new is not UNSET})
    if not cleaned:
        return fact
    db = write_db()
    with transaction.atomic(using=db):
        locked = _lock(db, fact)
        row = Fact.objects.using(db).select_for_update().get(pk=fact.pk)
        for name, new in cleaned.items():
            setattr(row, name, new)
        if "key" in cleaned and _has_key(db, row):
            raise _duplicate(row)
        if "key" in cleaned or "value" in cleaned:
            row.summary = None  # the person's words now, not a summary's
        if "value" in cleaned:
            row.proposed_value, row.proposed_by = "", None
        row.token_count = line_tokens(row, model=_model(row, locked))
        row.changed_by = Fact.ChangedBy.PERSON
        row.changed_by_user = user
        row.confirmed_at = timezone.now()
        _save(db, row, update_fields=CHANGED_FIELDS)
        facts_recount(locked, changed=True)
    for model_field in Fact._meta.concrete_fields:
        setattr(fact, model_field.attname, getattr(row, model_field.attname))
    return fact


def fact_delete(*, fact: Fact, user: Any) -> None:
    """A person deletes ``fact`` (with the record of the summarizer's changes to it: a
    revert has nothing of it to undo). A fact deleted meanwhile is no error."""
    db = write_db()
    with transaction.atomic(using=db):
        locked = _lock(db, fact)
        deleted, _ = Fact.objects.using(db).filter(pk=fact.pk).delete()
        if deleted:
            facts_recount(locked, changed=True)
    if deleted:
        logger.info("Fact %s (%r) deleted by %s", fact.pk, fact.key, user)
