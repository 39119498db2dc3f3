"""Undoing a compaction: the context is what it was before the active summary was written,
plus whatever was appended since. No summarizer call, but the compaction's lease and
compare-and-commit all the same (docs/architecture.md, "Undo a compaction").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext_lazy as _

from ctxsum.hooks import SummaryReverted, commit_apply, commit_lock, concerned
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary, single
from ctxsum.policy import Reason
from ctxsum.selectors import SUMMARY_HEAVY
from ctxsum.services.autocompact import withheld_rebuild
from ctxsum.services.compaction import active_summary_is, commit_save, signal_after_commit
from ctxsum.services.leases import LeaseLost, lease_lock, leased
from ctxsum.services.transactions import write_db

NOT_ACTIVE = _(
    "Version {version} is not the active summary (the active one is v{active}); only the "
    "active summary can be reverted."
)
NONE_ACTIVE = _("Version {version} is not the active summary; the conversation has none to revert.")


@dataclass(frozen=True, kw_only=True)
class Reverted:
    """What a revert did; ``reason`` says why when nothing was reverted. ``summary``: the
    version active afterwards; ``restored``: the messages active again, by seq."""

    reverted: bool
    reason: Reason
    reverted_summary: Summary
    summary: Summary | None = None
    restored: list[Message] = field(default_factory=list)
    attempt: CompactionAttempt | None = None


def conversation_revert(*, conversation: Conversation, version: int) -> Reverted:
    """Revert summary ``version``, which must be the conversation's active summary (else a
    ValidationError naming ``version``). Raises Summary.DoesNotExist or
    Conversation.DoesNotExist. ``conversation`` is brought up to date."""
    db = write_db(conversation)
    conversation.update_from(Conversation.objects.using(db).get(pk=conversation.pk))
    summaries = Summary.objects.using(db).filter(conversation=conversation)
    # The version made active again comes with the one it extends: the answer names it,
    # and nothing is left to read once the revert has committed.
    target = summaries.select_related("previous__previous").get(version=version)
    if not target.active:
        active = single(summaries.filter(active=True).values_list("version", flat=True))
        message = NONE_ACTIVE if active is None else NOT_ACTIVE
        raise ValidationError({"version": [message.format(version=version, active=active)]})
    try:
        with leased(conversation, db=db) as token:
            if token is None:
                return Reverted(reverted=False, reason=Reason.IN_PROGRESS, reverted_summary=target)
            locked, restored, attempt = _commit(conversation, target, token, db=db)
    except LeaseLost:
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
    """Under the row lock and the lease: the messages ``target`` archived, and the version it
    was written from (None: none; read now, a redaction may have withheld it), active again."""
    db = locked._state.db
    archived = Message.objects.using(db).filter(conversation=locked, summary=target)
    restored = list(archived.order_by("seq"))
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
    event = SummaryReverted(target=target)
    hooks = concerned(conversation, event, db=db)
    with transaction.atomic(using=db):
        held = commit_lock(conversation, hooks, event, db=db)  # before the row's lock
        locked = lease_lock(conversation, token, db=db)
        if not active_summary_is(locked, target):  # changed since it was read: out of date
            raise LeaseLost
        restored, previous = _restore(locked, target)
        before = locked.context_tokens
        restored_tokens = sum(row.token_count for row in restored)
        locked.active_message_count += len(restored)
        locked.archived_message_count -= len(restored)
        locked.archived_tokens -= restored_tokens
        locked.active_tokens += (
            restored_tokens - target.token_count + (previous.token_count if previous else 0)
        )
        commit_apply(held, event, locked=locked)
        attempt = commit_save(
            locked,
            outcome=CompactionAttempt.Outcome.REVERTED,
            reason=Reason.REVERTED,
            summary=target,
            tokens_before=before,
            from_seq=restored[0].seq if restored else None,
            to_seq=restored[-1].seq if restored else None,
        )
        signal_after_commit(
            "summary_reverted", locked, db=db, summary=target, restored=previous, attempt=attempt
        )
        if previous is not None and previous.covers_redacted:
            # Back to a version withheld after a redaction: rebuilt by itself (invariant f).
            transaction.on_commit(partial(withheld_rebuild, str(locked.pk), db), using=db)
    return locked, restored, attempt
