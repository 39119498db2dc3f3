"""Undoing a compaction: the active summary is reverted, and the context is what it was
before that summary was written, plus whatever was appended since.

The version it extended (or none) is the active summary again; the messages it archived
are active again, whole tool rounds as they were archived; the counters and ``revision``
move; the reverted version stays in the history, marked ``reverted``, and archives
nothing; the key facts it wrote are undone (ctxsum.facts.merge). Reverting a rebuild
makes the version it superseded active again and restores no message (a rebuild archives
none). Reverting again walks back one more version.

No summarizer call, but the compaction's discipline all the same (docs/architecture.md,
"Undo a compaction"): read what is active without a lock, take the compaction lease, then
in one transaction lock the row filtered on the lease, check that the summary being
reverted is still the active one, write, and release the lease in the same write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext_lazy as _

from ctxsum.hooks import SummaryReverted, commit_apply, commit_lock, concerned
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import SUMMARY_HEAVY
from ctxsum.services.autocompact import withheld_rebuild
from ctxsum.services.compaction import COMMIT_FIELDS, active_summary_is
from ctxsum.services.leases import LeaseLost, WriteNothing, lease_lock, leased
from ctxsum.services.transactions import after_commit, write_db
from ctxsum.signals import summary_reverted

NOT_ACTIVE = _(
    "Version {version} is not the active summary (the active one is v{active}); only the "
    "active summary can be reverted."
)
NONE_ACTIVE = _("Version {version} is not the active summary; the conversation has none to revert.")
Outcome = CompactionAttempt.Outcome


class _Conflict(WriteNothing):
    """The active summary changed since it was read: write nothing."""


@dataclass(frozen=True, kw_only=True)
class Reverted:
    """What a revert did; ``reason`` says why when nothing was reverted.

    ``reverted_summary`` is the version asked for; ``summary`` the one active afterwards
    (None when the reverted version was the first, or when nothing was reverted);
    ``restored`` the messages that are active again, by seq.
    """

    reverted: bool
    reason: Reason
    reverted_summary: Summary
    summary: Summary | None = None
    restored: list[Message] = field(default_factory=list)
    attempt: CompactionAttempt | None = None


def conversation_revert(*, conversation: Conversation, version: int) -> Reverted:
    """Revert summary ``version``, which must be the conversation's active summary.

    Raises Summary.DoesNotExist when the conversation has no such version, and a
    ValidationError naming ``version`` when it is not the active one. ``in_progress`` when
    another worker holds the compaction lease, ``conflict`` when a compaction (or another
    revert) changed the active summary between the read and the commit: nothing is written
    then. Raises Conversation.DoesNotExist when the conversation is gone.
    ``conversation`` is brought up to date.
    """
    db = write_db(conversation)
    conversation.update_from(Conversation.objects.using(db).get(pk=conversation.pk))
    summaries = Summary.objects.using(db).filter(conversation=conversation)
    # The version made active again comes with the one it extends: the answer names it,
    # and nothing is left to read once the revert has committed.
    target = summaries.select_related("previous__previous").get(version=version)
    if not target.active:
        active = summaries.filter(active=True).values_list("version", flat=True).first()
        message = NONE_ACTIVE if active is None else NOT_ACTIVE
        raise ValidationError({"version": [message.format(version=version, active=active)]})
    try:
        with leased(conversation, db=db) as token:
            if token is None:
                return Reverted(reverted=False, reason=Reason.IN_PROGRESS, reverted_summary=target)
            locked, restored, attempt = _commit(conversation, target, token, db=db)
    except (_Conflict, LeaseLost):
        return Reverted(reverted=False, reason=Reason.CONFLICT, reverted_summary=target)
    conversation.update_from(locked)
    return Reverted(
        reverted=True,
        reason=Reason.REVERTED,
        reverted_summary=target,
        summary=target.previous,
        restored=restored,
        attempt=attempt,
    )


def _restore(locked: Conversation, target: Summary) -> tuple[list[Message], Summary | None]:
    """Under the row lock and the lease: the messages ``target`` archived active again, and
    the version it was written from active again (None: there is none), read now: a
    redaction may have withheld it since ``target`` was read."""
    db = locked._state.db
    archived = Message.objects.using(db).filter(conversation=locked, summary=target)
    restored = list(archived.order_by("seq"))
    # Inside the transaction under the row lock and the lease, nobody else archives or
    # restores: the rows read are the rows updated.
    archived.update(summary=None)
    for row in restored:
        row.summary = None
    # One active summary per conversation: the reverted one goes first.
    Summary.objects.using(db).filter(pk=target.pk).update(active=False, reverted=True)
    target.active, target.reverted = False, True
    if target.previous_id is None:
        return restored, None
    # Active again, so no longer superseded (when the reverted version rebuilt it).
    versions = Summary.objects.using(db).filter(pk=target.previous_id)
    versions.update(active=True, superseded=False)
    previous = versions.defer(*SUMMARY_HEAVY).select_related("previous").get()
    target.previous = previous
    return restored, previous


def _commit(
    conversation: Conversation, target: Summary, token: str, *, db: str
) -> tuple[Conversation, list[Message], CompactionAttempt]:
    """Revert ``target`` if it is still the active summary; the row as it was left, the
    messages restored, and the attempt recorded."""
    event = SummaryReverted(target=target)
    hooks = concerned(conversation, event, db=db)  # a version's facts: written by its commit
    with transaction.atomic(using=db):
        # What the hooks lock (a subject's conversations, for the facts the version wrote)
        # first; else the row's own lock is all it takes.
        held = commit_lock(conversation, hooks, event, db=db)
        # Filtered on the lease: a worker that took an abandoned lease over makes this lose.
        locked = lease_lock(conversation, token, db=db)
        if not active_summary_is(locked, target):
            raise _Conflict
        restored, previous = _restore(locked, target)
        before = locked.context_tokens
        restored_tokens = sum(row.token_count for row in restored)
        locked.active_message_count += len(restored)
        locked.active_tokens += (
            restored_tokens - target.token_count + (previous.token_count if previous else 0)
        )
        # The facts the version wrote go with it, unless a person took them over since.
        commit_apply(held, event, locked=locked)
        locked.revision += 1
        locked.lease_owner, locked.leased_at = "", None
        locked.save(update_fields=COMMIT_FIELDS)  # what a compaction's commit moves
        attempt = CompactionAttempt.objects.using(db).create(
            conversation=locked,
            outcome=Outcome.REVERTED,
            reason=Reason.REVERTED,
            summary=target,
            tokens_before=before,
            tokens_after=locked.context_tokens,
            from_seq=restored[0].seq if restored else None,
            to_seq=restored[-1].seq if restored else None,
        )
        send = partial(
            summary_reverted.send,
            sender=Conversation,
            conversation=locked,
            summary=target,
            restored=previous,
            attempt=attempt,
        )
        after_commit(send, using=db, what=f"summary_reverted of conversation {locked.pk}")
        if previous is not None and previous.covers_redacted:
            # Back to a version withheld after a redaction: rebuilt by itself (invariant f).
            transaction.on_commit(partial(withheld_rebuild, str(locked.pk), db), using=db)
    return locked, restored, attempt
