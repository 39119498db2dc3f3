"""Compact one conversation, several, or all that have reached their trigger; ``--due``,
those with compaction work due and no live lease, as a schedule would."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ctxsum.management.batches import ConversationBatchCommand
from ctxsum.models import Conversation
from ctxsum.services import conversation_compact, conversation_compact_queued, write_db


class Command(ConversationBatchCommand):
    help = "Compact conversations that reached their trigger (or the ones named)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--due",
            action="store_true",
            help="every conversation with compaction work due and no live lease, as a "
            "background compaction would (one lost with its worker, say)",
        )
        parser.add_argument("--dry-run", action="store_true", help="plan only: no LLM call")
        parser.add_argument("--force", action="store_true", help="ignore the trigger")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["due"]:
            if options["conversations"] or options["all"]:
                raise CommandError("--due selects the conversations itself: name none.")
            if options["force"] or options["dry_run"]:
                raise CommandError("--due compacts what is due: no --force, no --dry-run.")
            options["all"] = True
        super().handle(*args, **options)

    def run_one(self, conversation: Conversation, options: dict[str, Any]) -> tuple[str, str]:
        if options["due"]:
            due = conversation_compact_queued(
                conversation_id=str(conversation.pk), database=write_db(conversation)
            )
            return str(due.reason), f"{conversation.pk}: {due.reason}"
        result = conversation_compact(
            conversation=conversation, force=options["force"], dry_run=options["dry_run"]
        )
        line = f"{conversation.pk}: {result.reason}"
        plan = result.plan
        if plan is not None and (result.compacted or options["dry_run"]):
            line += f" ({plan.tokens_before} -> {plan.tokens_after} tokens)"
        return str(result.reason), line
