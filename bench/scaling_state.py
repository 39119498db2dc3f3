"""The mixed table ``bench.scaling`` measures: in one set of tables, target conversations of
10 to 100,000 messages, each size twice (compacted and never compacted), among other
conversations (every dialogue of the data as a conversation of its own, and one agent
conversation of 100,000 messages never compacted).

History is written with ``bulk_create`` straight into the tables, the counters moved as an
append would move them; the compacted targets are compacted by the service
(``conversation_compact(force=True)`` with the fixed-size summarizer) after every batch, as
``bench/prepare_state.py`` does. Every target ends with the same 6 messages, so every
compacted context is the same (system message, summary, those 6) whatever the history's
length. Django must be set up.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import KEEP_MESSAGES, POLICY
from bench.prepare_state import COUNTERS, Built, batches, history_stream
from tests.support.replay_data import iter_records
from tests.support.shared import DATA_DIR

AGENT_FILE = "agent_trajectories.jsonl.gz"
DIALOGUE_FILE = "long_chats.jsonl.gz"
INSERT_BATCH = 2000


@dataclass
class Pool:
    """The data's messages, cleaned as an append would clean them, with their token counts
    (``tokens_of``, by ``id()`` of the cleaned message: each is counted once however often
    the history reuses it)."""

    system: str
    runs: list[list[dict[str, Any]]]  # agent runs, after their system message
    dialogues: list[list[dict[str, Any]]]
    tail: list[dict[str, Any]]  # the last messages of every target
    tokens_of: dict[int, int] = field(default_factory=dict)

    def count(self, messages: Iterable[dict[str, Any]]) -> list[int]:
        return [self.tokens_of[id(message)] for message in messages]


def add_table_options(parser: argparse.ArgumentParser) -> None:
    """The options of the mixed table a command builds (``target_build``, ``others_build``)."""
    parser.add_argument(
        "--batch", type=int, default=1_000, help="compact a target after every N messages"
    )
    parser.add_argument(
        "--other-large",
        type=int,
        default=100_000,
        help="messages of the other, never compacted, agent conversation (0: none)",
    )
    parser.add_argument(
        "--dialogues", type=int, default=None, help="other conversations: the first N dialogues"
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)


def load_pool(data_dir: Path, *, dialogues: int | None = None) -> Pool:
    """Every agent run and (at most ``dialogues``) dialogue of ``data_dir``, cleaned and
    counted."""
    return pool_of(
        (record for _, record in iter_records(data_dir, (AGENT_FILE,))),
        (record for _, record in iter_records(data_dir, (DIALOGUE_FILE,), limit=dialogues)),
    )


def sample_pool(path: Path) -> Pool:
    """The pool of one JSONL file of conversations (the tests' shipped sample): a record
    that starts with a system message is an agent run, any other a dialogue."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    agent_runs = [record for record in records if record["messages"][0]["role"] == "system"]
    dialogues = [record for record in records if record["messages"][0]["role"] != "system"]
    return pool_of(agent_runs, dialogues)


def pool_of(agent_runs: Iterable[dict[str, Any]], dialogues: Iterable[dict[str, Any]]) -> Pool:
    """The pool of these records (each with its ``messages``): the first run's system
    message, every run's messages after its system message, every dialogue; the tail is the
    first dialogue's first ``KEEP_MESSAGES`` messages."""
    from ctxsum import tokens
    from ctxsum.conf import ctxsum_settings
    from ctxsum.validation import clean_message

    pool = Pool(system="", runs=[], dialogues=[], tail=[])

    def cleaned(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for message in messages:
            clean = clean_message(message, max_bytes=ctxsum_settings.MAX_MESSAGE_BYTES)
            pool.tokens_of[id(clean)] = tokens.count_message(clean)
            out.append(clean)
        return out

    for record in agent_runs:
        messages = record["messages"]
        if messages and messages[0]["role"] == "system":
            pool.system = pool.system or messages[0]["content"]
            messages = messages[1:]
        pool.runs.append(cleaned(messages))
    for record in dialogues:
        pool.dialogues.append(cleaned(record["messages"]))
    pool.tail = pool.dialogues[0][:KEEP_MESSAGES]
    return pool


def conversations_create(owner: Any, titles: Sequence[str], **fields: Any) -> list[Any]:
    """New conversations, written in one ``bulk_create`` (no system message)."""
    from ctxsum.models import Conversation

    rows = [Conversation(owner=owner, title=title, **fields) for title in titles]
    return Conversation.objects.bulk_create(rows, batch_size=INSERT_BATCH)


def history_insert(pool: Pool, histories: Sequence[tuple[Any, Sequence[dict[str, Any]]]]) -> int:
    """Write each ``(conversation, messages)``'s messages after the conversation's last one,
    with ``bulk_create``, and move its counters as an append of them would; the rows written."""
    from django.db import transaction
    from django.db.models import F

    from ctxsum.models import Conversation, Message
    from ctxsum.validation import EXTRA_FIELDS

    pending: list[Any] = []
    written = 0

    def flush() -> None:
        nonlocal written, pending
        Message.objects.bulk_create(pending, batch_size=INSERT_BATCH)
        written += len(pending)
        pending = []

    with transaction.atomic():
        for conversation, messages in histories:
            counts = pool.count(messages)
            for offset, (message, count) in enumerate(zip(messages, counts, strict=True)):
                pending.append(
                    Message(
                        conversation_id=conversation.pk,
                        seq=conversation.next_seq + offset,
                        role=message["role"],
                        content=message["content"],
                        name=message.get("name", ""),
                        tool_calls=message.get("tool_calls"),
                        tool_call_id=message.get("tool_call_id", ""),
                        extra={key: message[key] for key in EXTRA_FIELDS if key in message},
                        token_count=count,
                    )
                )
                if len(pending) >= INSERT_BATCH:
                    flush()
            added = len(messages)
            Conversation.objects.filter(pk=conversation.pk).update(
                next_seq=F("next_seq") + added,
                message_count=F("message_count") + added,
                active_message_count=F("active_message_count") + added,
                active_tokens=F("active_tokens") + sum(counts),
                revision=F("revision") + 1,
            )
            conversation.next_seq += added
        if pending:
            flush()
    return written


def target_body(pool: Pool, size: int) -> list[dict[str, Any]]:
    """A target's messages after its system message: agent-run history (cut where no tool
    round is split), then the tail; ``size`` messages with the system message, or a few
    more when the cut moved past a tool result."""
    filler = max(0, size - 1 - len(pool.tail))
    return [*(history_stream(pool.runs, filler) if filler else []), *pool.tail]


def target_build(pool: Pool, *, owner: Any, size: int, compacted: bool, batch: int) -> Built:
    """One target conversation; compacted (forced, after every ``batch`` messages) or not."""
    from ctxsum.models import Summary
    from ctxsum.services import conversation_compact, conversation_create

    started = time.perf_counter()
    kind = "compacted" if compacted else "uncompacted"
    conversation = conversation_create(
        owner=owner, title=f"scaling {size} {kind}", system=pool.system, **POLICY
    )
    body = target_body(pool, size)
    for chunk in batches(body, batch) if compacted else [body]:
        history_insert(pool, [(conversation, chunk)])
        if compacted:
            result = conversation_compact(conversation=conversation, force=True)
            if not result.compacted:
                raise RuntimeError(f"building {size}: the compaction did not run: {result.reason}")
    conversation.refresh_from_db()
    return Built(
        conversation=conversation,
        history=conversation.message_count,
        summaries=Summary.objects.filter(conversation=conversation).count(),
        seconds=time.perf_counter() - started,
        counters={name: getattr(conversation, name) for name in COUNTERS},
    )


def others_build(pool: Pool, *, owner: Any, large: int) -> dict[str, Any]:
    """The conversations beside the targets: one per dialogue, and one of ``large`` agent
    messages (system message included) never compacted."""
    from ctxsum.services import conversation_create

    started = time.perf_counter()
    histories: list[tuple[Any, Sequence[dict[str, Any]]]] = []
    if large:
        big = conversation_create(owner=owner, title=f"other {large}", system=pool.system)
        histories.append((big, history_stream(pool.runs, large - 1)))
    titles = [f"dialogue {index}" for index in range(len(pool.dialogues))]
    for conversation, dialogue in zip(
        conversations_create(owner, titles), pool.dialogues, strict=True
    ):
        histories.append((conversation, dialogue))
    written = history_insert(pool, histories)
    return {
        "conversations": len(histories),
        "messages": written + bool(large),
        "largest": large,
        "seconds": round(time.perf_counter() - started, 1),
    }


def settle() -> None:
    """Leave the database as a table that has been growing for a while would be, not as a
    bulk load leaves it: on PostgreSQL, the planner's statistics refreshed (``ANALYZE``, as
    autovacuum would) and the loaded data written out (``CHECKPOINT``: otherwise the
    checkpointer writes hundreds of MB during the measurement and every commit's fsync
    waits behind it); on SQLite, the write-ahead log checkpointed."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE")
            cursor.execute("CHECKPOINT")
        else:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def table_facts() -> dict[str, int]:
    """Rows in the tables the measured operations read."""
    from ctxsum.models import Conversation, Message, Summary

    return {
        "conversations": Conversation.objects.count(),
        "messages": Message.objects.count(),
        "active_messages": Message.objects.active().count(),
        "summaries": Summary.objects.count(),
    }
