"""Import conversations from JSON Lines files for one user (ctxsum.services.imports does
the work; this command parses arguments and shows progress)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ctxsum.services import REASONS_SHOWN, Tally, file_import, imported_source_ids

PROGRESS_SECONDS = 0.1


@dataclass
class Progress:
    """A one-line progress bar on a terminal, redrawn with ``\\r``; silent elsewhere."""

    out: Any
    label: str
    total: int  # bytes
    limit: int | None
    enabled: bool
    last: float = 0.0
    last_line: int = 0  # the last line read, for an error message
    WIDTH: ClassVar[int] = 30

    def update(self, done_bytes: int, tally: Tally) -> None:
        self.last_line = tally.last_line
        now = time.monotonic()
        if not self.enabled or now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        share = done_bytes / self.total
        if self.limit:  # with --limit, the share of the lines to read
            share = max(share, (tally.conversations + tally.rejected + tally.skipped) / self.limit)
        share = min(share, 1.0)
        bar = "#" * int(share * self.WIDTH)
        self.out.write(
            f"\r{self.label} [{bar:<{self.WIDTH}}] {share:4.0%} "
            f"{tally.conversations} imported, {tally.rejected} rejected, "
            f"{tally.skipped} skipped",
            style_func=str,
            ending="",
        )
        self.out.flush()

    def close(self) -> None:
        if self.enabled:
            self.out.write("\r\033[K", style_func=str, ending="")
            self.out.flush()


class Command(BaseCommand):
    help = (
        "Import conversations from JSON Lines files (plain or .gz; one conversation per "
        "line: id, source, license, meta, messages in OpenAI format) for one user. "
        "Lines whose id the user already imported are skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("files", nargs="+", metavar="FILE", help="a .jsonl or .jsonl.gz file")
        parser.add_argument("--user", required=True, help="username of the owner")
        parser.add_argument(
            "--create-user",
            action="store_true",
            help="create the user (without a usable password) if it does not exist",
        )
        parser.add_argument(
            "--limit",
            type=int,
            metavar="N",
            help="read only the first N conversations of each file",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        paths = [Path(name) for name in options["files"]]
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            raise CommandError(f"No such file: {', '.join(missing)}")
        limit = options["limit"]
        if limit is not None and limit < 0:
            raise CommandError("--limit must be 0 or more.")
        owner = self._owner(options["user"], create=options["create_user"])
        verbosity = options["verbosity"]

        seen = imported_source_ids(owner)
        total = Tally()
        for path in paths:
            tally = self._import_file(path, owner, seen, limit, verbosity)
            total.add(tally)
            if len(paths) > 1 and verbosity > 0:
                self.stdout.write(f"{path}: {self._counts(tally)}")
        self.stdout.write(f"Imported for {owner.get_username()}: {self._counts(total)}")
        for reason in total.reasons[:REASONS_SHOWN]:
            self.stdout.write(f"  rejected {reason}")
        if len(total.reasons) > REASONS_SHOWN:
            self.stdout.write(f"  … and {len(total.reasons) - REASONS_SHOWN} more rejections")

    def _owner(self, username: str, *, create: bool) -> Any:
        User = get_user_model()
        try:
            return User._default_manager.get_by_natural_key(username)
        except User.DoesNotExist:
            if not create:
                raise CommandError(
                    f"No user {username!r}. Create it first, or pass --create-user."
                ) from None
        user = User._default_manager.create_user(**{User.USERNAME_FIELD: username})
        self.stdout.write(f"Created user {username!r} (no usable password).")
        return user

    @staticmethod
    def _counts(tally: Tally) -> str:
        return (
            f"{tally.conversations} conversations, {tally.messages} messages imported; "
            f"{tally.rejected} rejected; {tally.skipped} skipped (already imported)."
        )

    def _import_file(
        self, path: Path, owner: Any, seen: set[str], limit: int | None, verbosity: int
    ) -> Tally:
        enabled = verbosity > 0 and self.stderr.isatty()
        progress = Progress(self.stderr, path.name, max(path.stat().st_size, 1), limit, enabled)
        try:
            return file_import(path, owner=owner, seen=seen, limit=limit, progress=progress.update)
        except (OSError, EOFError) as error:  # unreadable, truncated or corrupt gzip
            raise CommandError(
                f"{path}: unreadable after line {progress.last_line}: {error}. "
                "The lines before it were processed; a re-run skips what was imported."
            ) from error
        finally:
            progress.close()
