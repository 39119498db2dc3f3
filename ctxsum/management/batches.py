"""What ctxsum's commands over many conversations share: naming them by id or selecting
them, one service call each, a counter on a terminal, and the counts per reason."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet

from ctxsum.exceptions import SummarizerError
from ctxsum.models import Conversation

FAILED = "failed"


class ConversationBatchCommand(BaseCommand):
    """A command that runs one service per conversation: the ones named by id, or those of
    ``selection()`` with ``--<selection_flag>``. Subclasses give ``run_one``."""

    selection_flag = "all"
    selection_help = "every conversation"
    verb = "compaction"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("conversations", nargs="*", metavar="CONVERSATION_ID")
        parser.add_argument(
            f"--{self.selection_flag}", action="store_true", help=self.selection_help
        )

    def selection(self) -> QuerySet[Conversation]:
        return Conversation.objects.all()

    def run_one(self, conversation: Conversation, options: dict[str, Any]) -> tuple[str, str]:
        """(reason, line) for one conversation; raise SummarizerError when it failed."""
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        ids = options["conversations"]
        if bool(ids) == options[self.selection_flag]:
            raise CommandError(f"Name conversation ids or give --{self.selection_flag} (not both).")
        conversations, total = self._named(ids) if ids else self._selected()
        # At verbosity 1 over a selection, a counter on a terminal, redrawn in place, stands
        # in for the line a conversation that -v 2 prints.
        progress = options["verbosity"] == 1 and not ids and self.stderr.isatty()
        counts: dict[str, int] = {}
        for done, conversation in enumerate(conversations, start=1):
            try:
                reason, line = self.run_one(conversation, options)
            except SummarizerError as error:
                reason, line = FAILED, f"{conversation.pk}: failed: {error}"
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
        if counts.get(FAILED):
            raise CommandError(f"{counts[FAILED]} {self.verb}(s) failed.")

    def _named(self, ids: list[str]) -> tuple[list[Conversation], int]:
        try:
            conversations = list(Conversation.objects.filter(pk__in=ids))
        except ValidationError as error:
            raise CommandError(f"Not a conversation id: {error.messages[0]}") from error
        missing = set(ids) - {str(conversation.pk) for conversation in conversations}
        if missing:
            raise CommandError(f"No such conversation: {', '.join(sorted(missing))}")
        return conversations, len(conversations)

    def _selected(self) -> tuple[Iterable[Conversation], int]:
        selection = self.selection().order_by("created_at")
        return selection.iterator(), selection.count()
