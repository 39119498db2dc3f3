"""Write docs/api.md from real requests, made on a new, empty database that is dropped
afterwards (the test runner's): the configured database is never touched."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS
from django.test.utils import setup_databases, teardown_databases

from project.api_docs import generate
from project.page_command import PageCommand


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


class Command(PageCommand):
    help = (
        "Write docs/api.md: make the requests it documents on a new database (the example "
        "project's settings, the offline summarizer) and record what they answer."
    )
    page = "docs/api.md"
    source = "the requests answer"

    def page_text(self) -> str:
        with _new_database(), _quiet():
            return generate()
