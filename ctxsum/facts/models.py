"""Key facts and what each summary version changed of them; their tables keep the names
they had in the core app, so a database migrated before the move adopts them."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from ctxsum.models import Conversation, Summary

# The order of a conversation's facts: the order its facts block considers them in (and
# every list of facts): pinned first, then the most recently confirmed; the key, then the
# id, break ties, so that two reads of the same facts always agree.
FACT_ORDER = ("-pinned", "-confirmed_at", "key", "pk")


class FactQuerySet(models.QuerySet["Fact"]):
    def of_subject(self, owner_id: Any, subject: str) -> FactQuerySet:
        """The facts of ``owner_id``'s subject ``subject`` (not a conversation's own)."""
        return self.filter(owner_id=owner_id, conversation__isnull=True, subject=subject)


class Fact(models.Model):
    """A key fact beside the summary: a conversation's own, or a subject's (``conversation``
    NULL), shared by all of the owner's conversations that name the subject.

    The summarizer writes facts; a person may add, edit, pin or delete them. The model never
    overwrites a person's edit or a pinned fact: what it would write instead is kept in
    ``proposed_value``.
    """

    class ChangedBy(models.TextChoices):
        MODEL = "model"
        PERSON = "person"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ctxsum_facts"
    )
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.CASCADE, related_name="facts"
    )
    subject = models.CharField(max_length=200, blank=True, default="")
    key = models.CharField(max_length=200)
    value = models.TextField()
    # The messages the fact came from: seqs of ``source_conversation`` (for a subject's fact,
    # the conversation whose compaction wrote it).
    source_seqs = models.JSONField(default=list, blank=True)
    source_conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The summary version that wrote the value or last changed it (NULL: a person's fact).
    summary = models.ForeignKey(
        Summary, null=True, blank=True, on_delete=models.SET_NULL, related_name="facts"
    )
    pinned = models.BooleanField(default=False)
    changed_by = models.CharField(max_length=16, choices=ChangedBy.choices, default=ChangedBy.MODEL)
    changed_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # A change the model proposed for a fact it may not overwrite, and the version that did.
    proposed_value = models.TextField(blank=True, default="")
    proposed_by = models.ForeignKey(
        Summary, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Tokens of the fact's line in the context's facts block.
    token_count = models.PositiveIntegerField(default=0)
    # Last written or confirmed (by the model, or a person): the facts block keeps pinned
    # facts first, then the most recently confirmed.
    confirmed_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = FactQuerySet.as_manager()

    class Meta:
        # Explicit: ctxsum.facts is inside the core's package, whose label Django would take
        # when a core module imports this one in a project without the app.
        app_label = "ctxsum_facts"
        db_table = "ctxsum_fact"
        ordering = list(FACT_ORDER)
        indexes = [
            # A conversation's facts in FACT_ORDER: its facts block and its list of facts read
            # the first ones without sorting all it holds.
            models.Index(
                fields=["conversation", "-pinned", "-confirmed_at", "key", "id"],
                name="ctxsum_fact_order",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(conversation__isnull=False, subject="")
                    | (Q(conversation__isnull=True) & ~Q(subject=""))
                ),
                name="ctxsum_fact_conversation_or_subject",
            ),
            models.UniqueConstraint(
                fields=["conversation", "key"],
                condition=Q(conversation__isnull=False),
                name="ctxsum_fact_conversation_key_uniq",
            ),
            models.UniqueConstraint(
                fields=["owner", "subject", "key"],
                condition=Q(conversation__isnull=True),
                name="ctxsum_fact_subject_key_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key}: {self.value}"


class CarriedFact(models.Model):
    """A fact whose value the context of ``conversation`` carried (its summary's text or a
    kept message) when that context last changed: its facts block leaves the fact out while
    its value is still ``value`` (docs/architecture.md, "Key facts")."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+")
    fact = models.ForeignKey(Fact, on_delete=models.CASCADE, related_name="+")
    value = models.TextField()

    class Meta:
        app_label = "ctxsum_facts"
        db_table = "ctxsum_carriedfact"
        constraints = [
            models.UniqueConstraint(fields=["conversation", "fact"], name="ctxsum_carried_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id}: {self.fact_id}"


class FactChange(models.Model):
    """One write of the summarizer to a fact, with the fact as it was before: what reverting
    that summary version undoes (unless a person has edited or pinned the fact since)."""

    class Kind(models.TextChoices):
        CREATED = "created"  # a new key: the fact did not exist
        UPDATED = "updated"  # a new value
        CONFIRMED = "confirmed"  # the same value again: confirmed_at and source_seqs moved
        PROPOSED = "proposed"  # a new value for a pinned or a person's fact, kept aside

    fact = models.ForeignKey(Fact, on_delete=models.CASCADE, related_name="changes")
    summary = models.ForeignKey(Summary, on_delete=models.CASCADE, related_name="fact_changes")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CREATED)
    # The fact before the change (nothing when the change created it). A redaction blanks
    # ``old_value`` taken from the redacted message: a revert then has no value to restore.
    old_value = models.TextField(blank=True, default="")
    old_source_seqs = models.JSONField(default=list, blank=True)
    old_source_conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    old_summary = models.ForeignKey(
        Summary, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    old_confirmed_at = models.DateTimeField(null=True, blank=True)
    old_proposed_value = models.TextField(blank=True, default="")
    old_proposed_by = models.ForeignKey(
        Summary, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "ctxsum_facts"
        db_table = "ctxsum_factchange"
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.summary_id}: {self.fact_id}"
