"""One process of ``bench.throughput``: Django set up on the shared database, then, phase
by phase as the parent says, a fixed duration of appends through ctxsum, of the floor's bare
transactions, or of compactions, started together with the other processes at a barrier.

- ``append``: ``services.message_append`` of one user message, again and again, to this
  process's own conversation;
- ``floor``: the same write with nothing around it, raw SQL on the same connection:
  ``BEGIN`` (``BEGIN IMMEDIATE`` on SQLite, as ctxsum's transactions there), ``INSERT`` one
  message row, ``UPDATE`` the conversation's counters, ``COMMIT``;
- ``compact``: ``services.conversation_compact`` on conversations this process prepared
  before the barrier (each over its trigger; the preparation is not timed).

The conversations grow during the run (nothing is rewound): an append costs the same
whatever the history's length.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import POLICY
from bench.prepare_sides import APPENDED


@dataclass(frozen=True)
class Setup:
    """What every process of a run needs to set itself up the same way."""

    database_url: str | None
    sqlite_dir: Path
    owner: str
    system: str
    block: list[dict[str, Any]]  # the history of a conversation to compact


@dataclass
class Phase:
    """One timed phase: ``mode`` for ``duration`` seconds, with ``supply`` conversations
    prepared beforehand for ``compact``."""

    mode: str
    duration: float
    supply: int = 0


@dataclass
class Outcome:
    worker: int
    mode: str
    done: int = 0
    errors: int = 0
    seconds: float = 0.0
    exhausted: bool = False
    error_samples: list[str] = field(default_factory=list)


def new_conversation(setup: Setup, owner: Any, title: str, messages: Any = None) -> Any:
    from ctxsum.services import conversation_create

    return conversation_create(
        owner=owner, title=title, system=setup.system, messages=messages, **POLICY
    )


class Floor:
    """The bare transaction of an append, in raw SQL on Django's own connection."""

    def __init__(self, conversation: Any, token_count: int) -> None:
        import json

        from django.db import connection

        from ctxsum.models import Conversation

        connection.ensure_connection()
        self.raw = connection.connection
        sqlite = connection.vendor == "sqlite"
        mark = "?" if sqlite else "%s"
        json_mark = "?" if sqlite else "%s::jsonb"
        self.begin = "BEGIN IMMEDIATE" if sqlite else "BEGIN"
        self.insert = (
            "INSERT INTO ctxsum_message (conversation_id, seq, role, content, name, "
            "tool_calls, tool_call_id, extra, token_count, is_leading, created_at) VALUES "
            f"({mark}, {mark}, {mark}, {json_mark}, '', NULL, '', {json_mark}, {mark}, "
            f"{'0' if sqlite else 'false'}, {mark})"
        )
        self.update = (
            "UPDATE ctxsum_conversation SET next_seq = next_seq + 1, "
            "message_count = message_count + 1, active_message_count = active_message_count "
            f"+ 1, active_tokens = active_tokens + {mark}, revision = revision + 1, "
            f"updated_at = {mark} WHERE id = {mark}"
        )
        self.conversation_id = Conversation._meta.pk.get_db_prep_value(conversation.pk, connection)
        self.content = json.dumps(APPENDED["content"])
        self.token_count = token_count
        self.seq = conversation.next_seq
        self.ops = connection.ops

    def append(self) -> None:
        from django.utils import timezone

        now = self.ops.adapt_datetimefield_value(timezone.now())
        cursor = self.raw.cursor()
        try:
            cursor.execute(self.begin)
            cursor.execute(
                self.insert,
                (self.conversation_id, self.seq, "user", self.content, "{}", self.token_count, now),
            )
            cursor.execute(self.update, (self.token_count, now, self.conversation_id))
            cursor.execute("COMMIT")
        except Exception:
            cursor.execute("ROLLBACK")
            raise
        finally:
            cursor.close()
        self.seq += 1


def run(
    index: int, setup: Setup, barrier: Any, phases: Any, results: Any, sqlite_immediate: bool
) -> None:
    """The process's main loop: set up, then run every phase ``phases`` hands it, until None."""
    try:
        from bench.common import setup_django

        setup_django(
            database_url=setup.database_url,
            sqlite_dir=setup.sqlite_dir,
            migrate=False,
            sqlite_immediate=sqlite_immediate,
        )
        from django.contrib.auth import get_user_model

        from ctxsum import tokens

        owner = get_user_model().objects.get(username=setup.owner)
        appended = new_conversation(setup, owner, f"throughput append {index}")
        floor = Floor(
            new_conversation(setup, owner, f"throughput floor {index}"),
            tokens.count_message(APPENDED),
        )
    except Exception:
        results.put(("setup_failed", index, traceback.format_exc()))
        raise
    results.put(("ready", index, None))
    while (phase := phases.get()) is not None:
        supply = [
            new_conversation(setup, owner, f"throughput compact {index}", setup.block)
            for _ in range(phase.supply)
        ]
        barrier.wait()
        outcome = run_phase(index, phase, appended, floor, supply)
        results.put(("done", index, outcome))


def run_phase(index: int, phase: Phase, appended: Any, floor: Floor, supply: list[Any]) -> Outcome:
    from ctxsum.services import conversation_compact, message_append

    outcome = Outcome(worker=index, mode=phase.mode)
    started = time.perf_counter()
    deadline = started + phase.duration
    todo = iter(supply)
    while time.perf_counter() < deadline:
        try:
            if phase.mode == "append":
                message_append(conversation=appended, messages=[dict(APPENDED)])
            elif phase.mode == "floor":
                floor.append()
            else:
                conversation = next(todo, None)
                if conversation is None:
                    outcome.exhausted = True
                    break
                if not conversation_compact(conversation=conversation).compacted:
                    raise RuntimeError("the compaction did not compact")
            outcome.done += 1
        except Exception as error:
            outcome.errors += 1
            if len(outcome.error_samples) < 3:
                outcome.error_samples.append(f"{type(error).__name__}: {error}")
    outcome.seconds = time.perf_counter() - started
    return outcome
