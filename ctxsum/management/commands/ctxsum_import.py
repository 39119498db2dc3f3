"""Import conversations from JSON Lines files, one conversation per line:

    {"id": str, "source": str, "license": str, "valid": bool, "meta": {...},
     "messages": [OpenAI chat messages], "title": str (optional)}

Plain or gzip-compressed. Each line goes through ``conversation_create``, which validates
and stores it all or nothing; a rejected line changes nothing and is counted with its
reason. A line whose ``id`` the user already imported is skipped, so a re-run only adds what
is new.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from ctxsum.exceptions import TooLarge
from ctxsum.models import Conversation
from ctxsum.services import conversation_create

GZIP_MAGIC = b"\x1f\x8b"
TITLE_CHARS = 80
# A meta entry is copied into the conversation's metadata when its JSON is this small.
META_VALUE_BYTES = 200
REASONS_SHOWN = 5
REASON_CHARS = 300
PROGRESS_SECONDS = 0.1
# Lines committed together. Each conversation stays all or nothing on its own (the service's
# transaction becomes a savepoint); committing in chunks spares one disk sync per
# conversation, and an interrupted run loses only its last chunk, which a re-run imports.
CHUNK_LINES = 200

NOT_AN_OBJECT = "not a JSON object"
NO_ID = "no 'id' (a non-empty string)"
NO_MESSAGES = "no 'messages' (a non-empty list)"


class RecordInvalid(ValueError):
    """A line that is not a conversation record at all (bad JSON, no id, no messages)."""


def record_title(record: Mapping[str, Any]) -> str:
    """The record's ``title``, else its first user message shortened, else its id."""
    title = record.get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()[:200]
    for message in record["messages"]:
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = next(
                (
                    part.get("text")
                    for part in content
                    if isinstance(part, Mapping) and part.get("type") == "text"
                ),
                None,
            )
        if isinstance(content, str) and content.strip():
            text = " ".join(content.split())
            return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
    return record["id"][:200]


def record_metadata(record: Mapping[str, Any]) -> dict[str, Any]:
    """Where the conversation came from, plus the record's small ``meta`` entries."""
    meta = record.get("meta")
    metadata: dict[str, Any] = {}
    if isinstance(meta, Mapping):
        for key, value in meta.items():
            if len(json.dumps(value, ensure_ascii=False).encode()) <= META_VALUE_BYTES:
                metadata[key] = value
    metadata.update(
        source_id=record["id"], source=record.get("source"), license=record.get("license")
    )
    return metadata


def record_parse(line: str | bytes) -> dict[str, Any]:
    """One line as a record; raise RecordInvalid when it cannot be one."""
    try:
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        record = json.loads(line)
    except UnicodeDecodeError as error:
        raise RecordInvalid(f"not UTF-8: {error}") from error
    except ValueError as error:
        raise RecordInvalid(f"not valid JSON: {error}") from error
    if not isinstance(record, dict):
        raise RecordInvalid(NOT_AN_OBJECT)
    if not isinstance(record.get("id"), str) or not record["id"]:
        raise RecordInvalid(NO_ID)
    if not isinstance(record.get("messages"), list) or not record["messages"]:
        raise RecordInvalid(NO_MESSAGES)
    return record


def record_import(*, owner: Any, record: Mapping[str, Any]) -> Conversation:
    """Store one parsed record for ``owner`` through the service layer (all or nothing)."""
    return conversation_create(
        owner=owner,
        title=record_title(record),
        metadata=record_metadata(record),
        messages=record["messages"],
    )


def imported_source_ids(owner: Any) -> set[str]:
    """Source ids of the conversations ``owner`` already imported."""
    return set(
        Conversation.objects.filter(owner=owner, metadata__has_key="source_id").values_list(
            "metadata__source_id", flat=True
        )
    )


def error_reason(error: Exception) -> str:
    """A one-line reason naming the fields, e.g. ``messages[3].tool_call_id: ...``."""
    if isinstance(error, ValidationError):
        if hasattr(error, "error_dict"):
            reason = "; ".join(
                f"{name}: {' '.join(messages)}" for name, messages in error.message_dict.items()
            )
        else:
            reason = " ".join(error.messages)
    else:
        reason = str(error)
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"


@dataclass
class Tally:
    conversations: int = 0
    messages: int = 0
    rejected: int = 0
    skipped: int = 0
    reasons: list[str] = field(default_factory=list)
    last_line: int = 0

    def add(self, other: Tally) -> None:
        self.conversations += other.conversations
        self.messages += other.messages
        self.rejected += other.rejected
        self.skipped += other.skipped
        self.reasons += other.reasons


class Progress:
    """A one-line progress bar on a terminal, redrawn with ``\\r``; silent elsewhere."""

    WIDTH = 30

    def __init__(
        self, out: Any, label: str, total_bytes: int, limit: int | None, enabled: bool
    ) -> None:
        self.out, self.label, self.total = out, label, max(total_bytes, 1)
        self.limit = limit
        self.enabled = enabled
        self.last = 0.0

    def update(self, done_bytes: int, tally: Tally) -> None:
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


def _lines(path: Path) -> Iterator[tuple[int, bytes, int]]:
    """(line number, line, file bytes read so far) of the non-blank lines of a plain or
    gzip file. Lines stay bytes: each is decoded on its own, so one bad line is one
    rejection."""
    with path.open("rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        stream: Any = gzip.GzipFile(fileobj=raw) if gzipped else raw
        for number, line in enumerate(stream, start=1):
            if line.strip():
                yield number, line, raw.tell()


def _chunks(
    lines: Iterator[tuple[int, bytes, int]], size: int
) -> Iterator[list[tuple[int, bytes, int]]]:
    chunk: list[tuple[int, bytes, int]] = []
    for item in lines:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


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
        tally = Tally()
        progress = Progress(
            self.stderr,
            path.name,
            path.stat().st_size,
            limit,
            enabled=verbosity > 0 and self.stderr.isatty(),
        )
        lines = islice(_lines(path), limit)
        try:
            for chunk in _chunks(lines, CHUNK_LINES):
                with transaction.atomic():
                    for number, line, done in chunk:
                        self._import_line(path, number, line, owner, seen, tally)
                        progress.update(done, tally)
        except (OSError, EOFError) as error:  # unreadable, truncated or corrupt gzip
            progress.close()
            raise CommandError(
                f"{path}: unreadable after line {tally.last_line}: {error}. "
                "The lines before it were processed; a re-run skips what was imported."
            ) from error
        progress.close()
        return tally

    @staticmethod
    def _import_line(
        path: Path, number: int, line: bytes, owner: Any, seen: set[str], tally: Tally
    ) -> None:
        tally.last_line = number
        try:
            record = record_parse(line)
            if record["id"] in seen:
                tally.skipped += 1
                return
            record_import(owner=owner, record=record)
        except (RecordInvalid, ValidationError, TooLarge) as error:
            tally.rejected += 1
            tally.reasons.append(f"{path.name}:{number}: {error_reason(error)}")
        else:
            seen.add(record["id"])
            tally.conversations += 1
            tally.messages += len(record["messages"])
