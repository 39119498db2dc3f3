"""The conversation's edit form: what ``conversation_update`` may change, checked by the
same rules the service and the REST API apply."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django import forms
from django.core.exceptions import ValidationError

from ctxsum.models import Conversation
from ctxsum.services import POLICY_FIELDS, fields_clean, policy_clean

if TYPE_CHECKING:
    ConversationModelForm = forms.ModelForm[Conversation]
else:
    ConversationModelForm = forms.ModelForm

FIELDS = ("title", "model", "subject", "metadata")
EDITABLE = (*FIELDS, *POLICY_FIELDS)


class ConversationForm(ConversationModelForm):
    """Title, model, subject, metadata and policy overrides. Saving goes through
    ``services.conversation_update`` (see ConversationAdmin.save_model), never
    ``Model.save()``; an invalid value is an error on its field and nothing is saved."""

    class Meta:
        model = Conversation
        fields = EDITABLE
        help_texts = {
            "trigger": 'JSON, e.g. {"messages": 40, "tokens": 12000}; empty: the default.',
            "keep": 'JSON, {"messages": N} or {"tokens": N}; empty: the default.',
            "max_context_tokens": "Empty: the default.",
            "subject": "The owner's facts of this subject join the context; empty: none.",
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        self._check(fields_clean, {name: cleaned[name] for name in FIELDS if name in cleaned})
        # A policy field that failed on its own has its error already.
        if all(name in cleaned for name in POLICY_FIELDS):
            self._check(policy_clean, {name: cleaned[name] for name in POLICY_FIELDS})
        return cleaned

    def _check(self, check: Callable[..., None], values: dict[str, Any]) -> None:
        try:
            check(**values)
        except ValidationError as error:
            self.add_error(None, error)  # a dict naming the fields: each error on its field

    def changes(self) -> dict[str, Any]:
        """The values for ``conversation_update``: every editable field (it writes only
        the ones that differ from the row)."""
        return {name: self.cleaned_data[name] for name in EDITABLE}
