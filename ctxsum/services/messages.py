"""Appending messages: validated and counted outside the transaction, stored inside one that
locks the conversation row to hand out gapless ``seq`` numbers and keep the counters exact.

``message_append`` locks the row with the UPDATE that moves its counters (``append_claim``);
``_append`` alone chooses that or, on PostgreSQL, the same as one statement. Writers that
hold the row already store through ``messages_insert``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connections, transaction
from django.db.models import Exists, OuterRef
from django.utils.translation import gettext_lazy as _

from ctxsum import tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import MessagesInvalid, Problem, TooLarge
from ctxsum.models import Conversation, Message, ToolCall
from ctxsum.policy import LEADING_ROLES
from ctxsum.services.append_claim import append_claim, append_claim_insert
from ctxsum.services.autocompact import (
    AutoCompaction,
    Schedule,
    aconversation_autocompact,
    autocompact_schedule,
    conversation_autocompact,
)
from ctxsum.services.idempotency import Claim, key_applied
from ctxsum.services.inserts import rows_insert
from ctxsum.services.transactions import after_commit, write_db
from ctxsum.signals import messages_appended
from ctxsum.threads import database_sync_to_async
from ctxsum.validation import (
    EXTRA_FIELDS,
    TOOL_CALL_ID_ANSWERED,
    TOOL_CALL_ID_ARCHIVED,
    TOOL_CALL_ID_UNKNOWN,
    clean_message,
)

BATCH_EMPTY = _("Send at least one message.")
BATCH_TYPE = _("Must be a list of messages.")
BATCH_TOO_LARGE = _("A batch holds {count} messages; the limit is {limit}.")
# A batch of cleaned messages.
Batch = Sequence[Mapping[str, Any]]
# What an append leaves: the conversation row, the rows stored, what follows (``_appended``).
Stored = tuple[Conversation, list[Message], Schedule]
# What an append changes on the conversation row (append_claim moves the same columns).
COUNTER_FIELDS = (
    "next_seq",
    "message_count",
    "active_message_count",
    "active_tokens",
    "revision",
    "updated_at",
)


def messages_clean(messages: Any) -> list[dict[str, Any]]:
    """Validate a batch; raise ValidationError naming every bad field, or TooLarge."""
    if not isinstance(messages, list | tuple):
        raise ValidationError({"messages": [str(BATCH_TYPE)]})
    if not messages:
        raise ValidationError({"messages": [str(BATCH_EMPTY)]})
    limit = ctxsum_settings.MAX_BATCH_MESSAGES
    if len(messages) > limit:
        raise TooLarge(BATCH_TOO_LARGE.format(count=len(messages), limit=limit))
    cleaned: list[dict[str, Any]] = []
    errors: list[dict[str, list[str]]] = []
    for message in messages:
        try:
            cleaned.append(clean_message(message, max_bytes=ctxsum_settings.MAX_MESSAGE_BYTES))
            errors.append({})
        except MessagesInvalid as invalid:
            errors.extend(invalid.per_message)
    if any(errors):
        raise MessagesInvalid(errors)
    return cleaned


def tool_results_check(conversation: Conversation, cleaned: Batch) -> None:
    """Raise MessagesInvalid for a tool result that answers no earlier tool call of the
    conversation (the nearest with its id), one whose request a summary archived (model APIs
    reject a result without its request), or one that has its result already."""
    errors: list[dict[str, list[str]]] = [{} for _ in cleaned]
    answered: dict[str, bool] = {}  # calls requested in the batch: answered yet?
    wanted: dict[int, str] = {}  # results for stored requests
    for index, message in enumerate(cleaned):
        if message["role"] == "tool":
            call_id = message["tool_call_id"]
            if call_id not in answered:
                wanted[index] = call_id
            elif answered[call_id]:
                errors[index] = _refusal(TOOL_CALL_ID_ANSWERED, call_id, "tool_call_answered")
            else:
                answered[call_id] = True
        for call in message.get("tool_calls") or ():
            answered[call["id"]] = False
    stored = _stored_requests(conversation, set(wanted.values())) if wanted else {}
    seen: set[str] = set()
    for index, call_id in wanted.items():
        archived, has_result = stored.get(call_id, (None, None))
        if archived is None:
            errors[index] = _refusal(TOOL_CALL_ID_UNKNOWN, call_id, "unknown_tool_call")
        elif archived:
            errors[index] = _refusal(TOOL_CALL_ID_ARCHIVED, call_id, "tool_call_summarized")
        elif has_result or call_id in seen:
            errors[index] = _refusal(TOOL_CALL_ID_ANSWERED, call_id, "tool_call_answered")
        seen.add(call_id)
    if any(errors):
        raise MessagesInvalid(errors)


def _refusal(message: Any, call_id: str, code: str) -> dict[str, list[str]]:
    return {"tool_call_id": [Problem(message.format(id=call_id), code)]}


def _stored_requests(
    conversation: Conversation, call_ids: set[str]
) -> dict[str, tuple[bool, bool]]:
    """For each id, whether the newest stored request with it is archived, and whether a
    result answers it already."""
    db = conversation._state.db
    results = Message.objects.using(db).filter(
        conversation=conversation,
        role="tool",
        tool_call_id=OuterRef("call_id"),
        seq__gt=OuterRef("seq"),
    )
    requests = (
        ToolCall.objects.using(db)
        .filter(conversation=conversation, call_id__in=call_ids)
        .annotate(answered=Exists(results))
        .order_by("seq")
        .values_list("call_id", "message__summary_id", "answered")
    )
    # In seq order, so the newest request with an id is the one that stays.
    return {
        call_id: (summary_id is not None, answered) for call_id, summary_id, answered in requests
    }


def messages_count(conversation: Conversation, cleaned: Batch) -> list[int]:
    """Token counts of ``cleaned``, taken once, before any lock is held."""
    count = partial(tokens.count_message, model=conversation.model or None)
    return [count(message) for message in cleaned]


def message_rows(
    conversation: Conversation, cleaned: Batch, counts: Sequence[int], *, first_seq: int
) -> list[Message]:
    """Unsaved Message rows for ``cleaned``, numbered from ``first_seq``."""
    numbered = enumerate(zip(cleaned, counts, strict=True), start=first_seq)
    return [
        Message(
            conversation=conversation,
            seq=seq,
            role=message["role"],
            content=message["content"],
            name=message.get("name", ""),
            tool_calls=message.get("tool_calls"),
            tool_call_id=message.get("tool_call_id", ""),
            extra={key: message[key] for key in EXTRA_FIELDS if key in message},
            token_count=token_count,
            is_leading=seq == 0 and message["role"] in LEADING_ROLES,
        )
        for seq, (message, token_count) in numbered
    ]


def messages_insert(
    conversation: Conversation,
    cleaned: Batch,
    counts: Sequence[int],
    *,
    leading: Mapping[str, Any] | None = None,
) -> list[Message]:
    """Store ``cleaned`` after the conversation's last message, behind ``leading`` (a new
    leading system message) when given; ``counts`` covers ``leading`` first. Tool results
    are checked first, errors indexed as in ``cleaned``. The caller holds the row lock."""
    tool_results_check(conversation, cleaned)
    batch = list(cleaned) if leading is None else [leading, *cleaned]
    rows = message_rows(conversation, batch, counts, first_seq=conversation.next_seq)
    if leading is not None:
        rows[0].is_leading = True
    _rows_insert(rows, db=conversation._state.db or write_db(conversation))
    conversation.next_seq += len(rows)
    conversation.message_count += len(rows)
    conversation.active_message_count += len(rows)
    conversation.active_tokens += sum(row.token_count for row in rows)
    conversation.revision += 1
    conversation.save(update_fields=COUNTER_FIELDS)
    return rows


def _rows_insert(rows: list[Message], *, db: str) -> None:
    """Insert ``rows`` and their tool calls' index rows."""
    rows_insert(rows, db=db)
    calls = [
        ToolCall(
            conversation_id=row.conversation_id,
            message=row,
            seq=row.seq,
            call_id=call["id"],
            name=call["function"]["name"],
        )
        for row in rows
        for call in row.tool_calls or ()
    ]
    rows_insert(calls, db=db)


@dataclass(frozen=True, kw_only=True)
class Appended:
    """What an append stored, and what the automatic compaction after it did or will do."""

    messages: list[Message]
    compaction: AutoCompaction | None = None


def message_append(
    *, conversation: Conversation, messages: Sequence[Any], idempotency: Claim | None = None
) -> Appended:
    """Append one or many messages, all or none, then the automatic compaction (its outcome
    in the result; a failed one never undoes the append). Raises ValidationError naming
    every bad field, or TooLarge. ``idempotency`` (an Idempotency-Key's claim) is marked
    applied in the append's transaction. ``conversation`` is brought up to date."""
    rows, schedule = _appended_rows(conversation, messages, idempotency)
    compaction = conversation_autocompact(conversation=conversation, schedule=schedule)
    return Appended(messages=rows, compaction=compaction)


async def amessage_append(
    *, conversation: Conversation, messages: Sequence[Any], idempotency: Claim | None = None
) -> Appended:
    """``message_append`` for async code: the same append, in the thread that serves the
    database, then an automatic compaction in this process through
    ``aconversation_compact``."""
    rows, schedule = await database_sync_to_async(_appended_rows)(
        conversation, messages, idempotency
    )
    compaction = await aconversation_autocompact(conversation=conversation, schedule=schedule)
    return Appended(messages=rows, compaction=compaction)


def _appended_rows(
    conversation: Conversation, messages: Sequence[Any], idempotency: Claim | None
) -> tuple[list[Message], Schedule]:
    """Check and store ``messages``: the rows stored and what follows the append."""
    cleaned = messages_clean(messages)
    counts = messages_count(conversation, cleaned)
    db = write_db(conversation)
    locked, rows, schedule = _append(conversation, cleaned, counts, db=db, key=idempotency)
    conversation.update_from(locked)
    return rows, schedule


def _append(
    conversation: Conversation, cleaned: Batch, counts: Sequence[int], *, db: str, key: Claim | None
) -> Stored:
    """Claim the conversation row and store ``cleaned``, all or none. On PostgreSQL, an
    append with nothing to check under the row lock (no tool result, no ``key``) whose
    first message cannot be leading is one statement; any other, a transaction."""
    if (
        key is None
        and connections[db].vendor == "postgresql"
        and cleaned[0]["role"] not in LEADING_ROLES
        and not any(message["role"] == "tool" for message in cleaned)
    ):
        rows = message_rows(conversation, cleaned, counts, first_seq=1)  # seqs: the claim's
        locked = append_claim_insert(pk=conversation.pk, db=db, rows=rows, tokens=sum(counts))
        return locked, rows, _appended(locked, rows, db=db)
    return _in_transaction(conversation, cleaned, counts, db=db, key=key)


def _in_transaction(
    conversation: Conversation, cleaned: Batch, counts: Sequence[int], *, db: str, key: Claim | None
) -> Stored:
    """The claim, then the checks under its row lock, then the INSERTs, in a transaction."""
    with transaction.atomic(using=db):
        count = len(cleaned)  # the counters move first, with the row lock
        locked = append_claim(pk=conversation.pk, db=db, count=count, tokens=sum(counts))
        key_applied(key)
        tool_results_check(locked, cleaned)
        rows = message_rows(locked, cleaned, counts, first_seq=locked.next_seq - count)
        _rows_insert(rows, db=db)
        return locked, rows, _appended(locked, rows, db=db)


def _appended(locked: Conversation, rows: list[Message], *, db: str) -> Schedule:
    """``messages_appended`` sent once the rows commit, and what follows the append."""
    send = partial(messages_appended.send, sender=Conversation, conversation=locked, messages=rows)
    after_commit(send, using=db, what=f"messages_appended of conversation {locked.pk}")
    return autocompact_schedule(locked)
