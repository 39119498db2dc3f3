"""Compact one conversation, several, or all that have reached their trigger."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ctxsum.exceptions import SummarizerError
from ctxsum.models import Conversation
from ctxsum.services.compaction import conversation_compact


class Command(BaseCommand):
    help = "Compact conversations that reached their trigger (or the ones named)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("conversations", nargs="*", metavar="CONVERSATION_ID")
        parser.add_argument("--all", action="store_true", help="every conversation")
        parser.add_argument("--dry-run", action="store_true", help="plan only: no LLM call")
        parser.add_argument("--force", action="store_true", help="ignore the trigger")

    def handle(self, *args: Any, **options: Any) -> None:
        ids = options["conversations"]
        conversations: Iterable[Conversation]
        if bool(ids) == options["all"]:
            raise CommandError("Name conversation ids or give --all (not both).")
        if ids:
            try:
                conversations = list(Conversation.objects.filter(pk__in=ids))
            except ValidationError as error:
                raise CommandError(f"Not a conversation id: {error.messages[0]}") from error
            missing = set(ids) - {str(conversation.pk) for conversation in conversations}
            if missing:
                raise CommandError(f"No such conversation: {', '.join(sorted(missing))}")
            total = len(conversations)
        else:
            conversations = Conversation.objects.order_by("created_at").iterator()
            total = Conversation.objects.count()

        # At verbosity 1 with --all, a counter on a terminal, redrawn in place, stands in for
        # the line a conversation that -v 2 prints.
        progress = options["verbosity"] == 1 and not ids and self.stderr.isatty()
        counts: dict[str, int] = {}
        for done, conversation in enumerate(conversations, start=1):
            try:
                result = conversation_compact(
                    conversation=conversation, force=options["force"], dry_run=options["dry_run"]
                )
                reason = str(result.reason)
                plan = result.plan
                line = f"{conversation.pk}: {reason}"
                if plan is not None and (result.compacted or options["dry_run"]):
                    line += f" ({plan.tokens_before} -> {plan.tokens_after} tokens)"
            except SummarizerError as error:
                reason = "failed"
                line = f"{conversation.pk}: failed: {error}"
            counts[reason] = counts.get(reason, 0) + 1
            if options["verbosity"] > 1 or ids:
                self.stdout.write(line)
            elif progress:
                self.stderr.write(f"\r{done}/{total} conversations", style_func=str, ending="")
                self.stderr.flush()
        if progress:
            self.stderr.write("", style_func=str)
        summary = ", ".join(f"{reason} {count}" for reason, count in sorted(counts.items()))
        self.stdout.write(f"{total} conversation(s): {summary or 'nothing to do'}")
        if counts.get("failed"):
            raise CommandError(f"{counts['failed']} compaction(s) failed.")
