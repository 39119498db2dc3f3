"""Write docs/reference/rest-api.md from the OpenAPI document the example project serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.rest_reference import PAGE, generate


class Command(BaseCommand):
    help = (
        "Write docs/reference/rest-api.md: the REST API reference, rendered from the OpenAPI "
        "document (drf-spectacular) the example project serves at /api/schema/."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--output",
            type=Path,
            default=None,
            help=f"where to write the page (default: {PAGE}); - for standard output",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="write nothing; fail when the page differs from what the document says",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        output = options["output"] or Path(settings.BASE_DIR) / PAGE
        text = generate()
        if str(output) == "-":
            self.stdout.write(text, ending="")
        elif options["check"]:
            if not output.is_file() or output.read_text(encoding="utf-8") != text:
                raise CommandError(f"{output} is out of date: run make docs.")
            self.stdout.write(f"{output} is up to date.")
        else:
            output.write_text(text, encoding="utf-8")
            self.stdout.write(f"Wrote {output}.")
