"""Undo the last compaction of conversations: revert each one's active summary
(ctxsum.services.conversation_revert)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from ctxsum.management.batches import ConversationBatchCommand
from ctxsum.models import Conversation, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import active_summary_version
from ctxsum.services import conversation_revert

NOTHING_TO_REVERT = "nothing_to_revert"


class Command(ConversationBatchCommand):
    help = (
        "Undo the last compaction of the conversations named, or with --all of every "
        "conversation that has a summary: each one's active summary is reverted, its "
        "archived messages become active again and the version before it is active again."
    )
    selection_help = "every conversation that has an active summary"
    verb = "revert"

    def selection(self) -> QuerySet[Conversation]:
        active = Summary.objects.filter(active=True)
        return Conversation.objects.filter(pk__in=active.values("conversation_id"))

    def run_one(self, conversation: Conversation, options: dict[str, Any]) -> tuple[str, str]:
        version = active_summary_version(conversation=conversation)
        if version is None:
            return NOTHING_TO_REVERT, f"{conversation.pk}: {NOTHING_TO_REVERT}"
        try:
            result = conversation_revert(conversation=conversation, version=version)
        except ValidationError:  # another request changed the active summary meanwhile
            return str(Reason.CONFLICT), f"{conversation.pk}: {Reason.CONFLICT}"
        line = f"{conversation.pk}: {result.reason}"
        if result.reverted:
            now = f"v{result.summary.version}" if result.summary else "none"
            line += f" (v{version} -> {now}, {len(result.restored)} messages restored)"
        return str(result.reason), line
