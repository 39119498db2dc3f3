"""The facts' REST shapes, in the core API's style (``ctxsum.api.serializers``): an input
serializer per write (the service checks their meaning) and the fact as answered."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ctxsum.api.serializers import StrictSerializer, StringField
from ctxsum.facts.models import Fact
from ctxsum.facts.services import NOT_A_BOOLEAN
from ctxsum.summarizers.facts import MAX_KEY_CHARS, MAX_VALUE_CHARS


class StrictBooleanField(serializers.BooleanField):
    """A BooleanField that takes only JSON true and false: DRF's own takes "yes", 1, …"""

    default_error_messages = {"invalid": NOT_A_BOOLEAN}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


KEY_HELP = (
    "Normalized as the summarizer's keys are: lower case, each run of characters other than "
    "letters and digits one underscore (`Order ID` is `order_id`)."
)


class FactInputSerializer(StrictSerializer):
    """PATCH of a fact: any of its value, key and pin. The service strips and checks them
    (blank, too long, a key over more than one line) and normalizes the key."""

    value = StringField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=MAX_VALUE_CHARS,
        help_text="Writing a value settles the model's proposal (`proposed_value`): send "
        "the proposed value to accept it.",
    )
    key = StringField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=MAX_KEY_CHARS,
        help_text=KEY_HELP,
    )
    pinned = StrictBooleanField(
        required=False, help_text="Pinned facts come first in the facts block."
    )


class FactCreateInputSerializer(FactInputSerializer):
    value = StringField(allow_blank=True, trim_whitespace=False, max_length=MAX_VALUE_CHARS)
    key = StringField(
        allow_blank=True, trim_whitespace=False, max_length=MAX_KEY_CHARS, help_text=KEY_HELP
    )
    pinned = StrictBooleanField(default=False)


class FactOutputSerializer(serializers.ModelSerializer[Fact]):
    """A key fact. ``in_context`` says whether the conversation's facts block shows it now
    (the view passes the ids it shows as ``context["shown"]``); null for a subject's facts
    listed on their own, since that depends on the conversation."""

    scope = serializers.SerializerMethodField()
    conversation = serializers.UUIDField(source="conversation_id", allow_null=True)
    source_conversation = serializers.UUIDField(source="source_conversation_id", allow_null=True)
    source_seqs = serializers.ListField(child=serializers.IntegerField(min_value=0))
    summary_version = serializers.IntegerField(
        allow_null=True,
        help_text="The summary version that wrote the value; null when a person wrote it.",
    )
    in_context = serializers.SerializerMethodField()

    class Meta:
        model = Fact
        fields = [
            "id",
            "key",
            "value",
            "scope",
            "conversation",
            "subject",
            "pinned",
            "changed_by",
            "source_conversation",
            "source_seqs",
            "summary_version",
            "proposed_value",
            "token_count",
            "in_context",
            "confirmed_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": "string", "enum": ["conversation", "subject"]})
    def get_scope(self, fact: Fact) -> str:
        return "conversation" if fact.conversation_id is not None else "subject"

    @extend_schema_field(serializers.BooleanField(allow_null=True))
    def get_in_context(self, fact: Fact) -> bool | None:
        shown = self.context.get("shown")
        return None if shown is None else fact.pk in shown
