"""Compact one conversation, several, or all that have reached their trigger."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ctxsum.management.batches import ConversationBatchCommand
from ctxsum.models import Conversation
from ctxsum.services.compaction import conversation_compact


class Command(ConversationBatchCommand):
    help = "Compact conversations that reached their trigger (or the ones named)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--dry-run", action="store_true", help="plan only: no LLM call")
        parser.add_argument("--force", action="store_true", help="ignore the trigger")

    def run_one(self, conversation: Conversation, options: dict[str, Any]) -> tuple[str, str]:
        result = conversation_compact(
            conversation=conversation, force=options["force"], dry_run=options["dry_run"]
        )
        line = f"{conversation.pk}: {result.reason}"
        plan = result.plan
        if plan is not None and (result.compacted or options["dry_run"]):
            line += f" ({plan.tokens_before} -> {plan.tokens_after} tokens)"
        return str(result.reason), line
