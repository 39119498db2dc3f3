"""The base of the commands that write a generated page of docs/ (``make docs``):
``--output`` (``-`` for standard output) and ``--check``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser


class PageCommand(BaseCommand):
    """Writes ``page`` (a path under the project's root) with the text ``page_text()``
    gives."""

    page: str
    # What --check compares the page with, in words.
    source: str

    def page_text(self) -> str:
        raise NotImplementedError

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--output",
            type=Path,
            default=None,
            help=f"where to write the page (default: {self.page}); - for standard output",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help=f"write nothing; fail when the page differs from what {self.source}",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        output = options["output"] or Path(settings.BASE_DIR) / self.page
        text = self.page_text()
        if str(output) == "-":
            self.stdout.write(text, ending="")
        elif options["check"]:
            if not output.is_file() or output.read_text(encoding="utf-8") != text:
                raise CommandError(f"{output} is out of date: run make docs.")
            self.stdout.write(f"{output} is up to date.")
        else:
            output.write_text(text, encoding="utf-8")
            self.stdout.write(f"Wrote {output}.")
