"""Importing conversations from JSON Lines records, one per line (the format:
docs/guide/management-commands.md, ``ctxsum_import``). Each is stored all or nothing by
``conversation_create``; a rejected one is counted with its reason, one whose ``id`` the
owner already imported is skipped.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from ctxsum.exceptions import TooLarge
from ctxsum.models import Conversation
from ctxsum.services.conversations import conversation_create

GZIP_MAGIC = b"\x1f\x8b"
TITLE_CHARS = 80
# A meta entry is copied into the conversation's metadata when its JSON is this small.
META_VALUE_BYTES = 200
REASONS_SHOWN = 5
REASON_CHARS = 300
# Lines committed together (each conversation in a savepoint): one disk sync per chunk, and
# an interrupted run loses only its last chunk, which a re-run imports.
CHUNK_LINES = 200


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
            parts = [part for part in content if isinstance(part, Mapping)]
            content = next((part.get("text") for part in parts if part.get("type") == "text"), None)
        if isinstance(content, str) and content.strip():
            text = " ".join(content.split())
            return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
    return str(record["id"])[:200]


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
        raise RecordInvalid("not a JSON object")
    if not isinstance(record.get("id"), str) or not record["id"]:
        raise RecordInvalid("no 'id' (a non-empty string)")
    if not isinstance(record.get("messages"), list) or not record["messages"]:
        raise RecordInvalid("no 'messages' (a non-empty list)")
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
    imported = Conversation.objects.filter(owner=owner, metadata__has_key="source_id")
    return set(imported.values_list("metadata__source_id", flat=True))


def error_reason(error: Exception) -> str:
    """A one-line reason naming the fields, e.g. ``messages[3].tool_call_id: ...``."""
    if isinstance(error, ValidationError) and hasattr(error, "error_dict"):
        fields = error.message_dict.items()
        reason = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in fields)
    elif isinstance(error, ValidationError):
        reason = " ".join(error.messages)
    else:
        reason = str(error)
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"


@dataclass(kw_only=True)
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


def _lines(path: Path) -> Iterator[tuple[int, bytes, int]]:
    """(line number, line, file bytes read so far) of the non-blank lines of a plain or gzip
    file. Lines stay bytes: each is decoded on its own, so one bad line is one rejection."""
    with path.open("rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        stream: Any = gzip.GzipFile(fileobj=raw) if gzipped else raw
        for number, line in enumerate(stream, start=1):
            if line.strip():
                yield number, line, raw.tell()


def file_import(
    path: Path,
    *,
    owner: Any,
    seen: set[str],
    limit: int | None = None,
    progress: Callable[[int, Tally], None] | None = None,
) -> Tally:
    """Import the records of one file for ``owner``, skipping ids in ``seen`` (which grows);
    ``progress(bytes_read, tally)`` after every line. Raises OSError or EOFError for a file
    that cannot be read to the end: the chunks before it stay imported."""
    tally, lines = Tally(), islice(_lines(path), limit)
    while chunk := list(islice(lines, CHUNK_LINES)):
        with transaction.atomic():
            for number, line, done in chunk:
                _line_import(path, number, line, owner, seen, tally)
                if progress is not None:
                    progress(done, tally)
    return tally


def _line_import(
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
