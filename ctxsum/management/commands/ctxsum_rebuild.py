"""Rebuild stale summaries: written anew from the archived originals under the current
prompt (ctxsum.services.conversation_rebuild)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from ctxsum.management.batches import ConversationBatchCommand
from ctxsum.models import Conversation
from ctxsum.selectors import stale_summaries
from ctxsum.services import conversation_rebuild


class Command(ConversationBatchCommand):
    help = (
        "Rebuild the summaries of the conversations named, or with --stale of every "
        "conversation whose active summary is stale (another prompt, or a redacted message)."
    )
    selection_flag = "stale"
    selection_help = "every conversation whose active summary is stale"
    verb = "rebuild"

    def selection(self) -> QuerySet[Conversation]:
        return Conversation.objects.filter(pk__in=stale_summaries().values("conversation_id"))

    def run_one(self, conversation: Conversation, options: dict[str, Any]) -> tuple[str, str]:
        result = conversation_rebuild(conversation=conversation)
        line = f"{conversation.pk}: {result.reason}"
        if result.summary is not None and result.replaced is not None:
            line += f" (v{result.replaced.version} -> v{result.summary.version})"
        return str(result.reason), line
