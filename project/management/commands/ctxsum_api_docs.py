"""Write docs/api.md from real requests, made on a new, empty database that is dropped
afterwards (the test runner's): the configured database is never touched."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS
from django.test.utils import setup_databases, teardown_databases

from project.api_docs import generate


def default_output() -> Path:
    return Path(settings.BASE_DIR) / "docs" / "api.md"


@contextmanager
def _new_database() -> Iterator[None]:
    """A new database for the default alias (SQLite: in memory), dropped afterwards."""
    old = setup_databases(
        verbosity=0, interactive=False, aliases={DEFAULT_DB_ALIAS: False}, serialized_aliases=()
    )
    try:
        yield
    finally:
        teardown_databases(old, verbosity=0)


@contextmanager
def _quiet() -> Iterator[None]:
    # The refused requests and the failed compactions are logged; the page is the output.
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


class Command(BaseCommand):
    help = (
        "Write docs/api.md: make the requests it documents on a new database (the example "
        "project's settings, the offline summarizer) and record what they answer."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--output",
            type=Path,
            default=None,
            help="where to write the page (default: docs/api.md); - for standard output",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="write nothing; fail when the page differs from what the requests answer",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        output = options["output"] or default_output()
        with _new_database(), _quiet():
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
