"""The compacted conversations ``bench.prepare_call`` measures: ``size`` messages of real
agent-run history (the runs' messages after their system message, cycled as often as
needed), appended in batches of at most 1,000 whole messages and compacted after every
batch with the fixed-size summarizer, the way a long-lived conversation ends up: a system
message, one active summary over almost everything, the last few messages verbatim, and
every older message archived in the same table. Django must be set up."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import KEEP_MESSAGES, TRIGGER_MESSAGES
from tests.support.replay_data import iter_records

BATCH = 1000
COUNTERS = ("next_seq", "message_count", "active_message_count", "active_tokens", "revision")


@dataclass
class Built:
    """A compacted conversation and the counters to restore it to after each call."""

    conversation: Any
    history: int  # messages stored, the system message included
    summaries: int
    seconds: float
    counters: dict[str, int]


def agent_pool(data_dir: Path) -> tuple[str, list[list[dict[str, Any]]]]:
    """The first run's system prompt, and every agent run's messages after its system
    message."""
    system = ""
    runs: list[list[dict[str, Any]]] = []
    for _, record in iter_records(data_dir, ("agent_trajectories.jsonl.gz",)):
        messages = record["messages"]
        if messages and messages[0]["role"] == "system":
            system = system or messages[0]["content"]
            messages = messages[1:]
        runs.append(messages)
    return system, runs


def history_stream(runs: Sequence[Sequence[dict[str, Any]]], size: int) -> list[dict[str, Any]]:
    """At least ``size`` messages of whole runs' messages in order (cycled), cut where no
    tool round is split."""
    stream: list[dict[str, Any]] = []
    for run in itertools.cycle(runs):
        stream.extend(run)
        if len(stream) >= size:
            break
    end = size
    while end < len(stream) and stream[end]["role"] == "tool":
        end += 1
    return stream[:end]


def batches(stream: Sequence[dict[str, Any]], size: int = BATCH) -> Iterator[list[Any]]:
    """``stream`` in slices of at most ``size``, each ending where no tool result follows."""
    start = 0
    while start < len(stream):
        end = min(start + size, len(stream))
        while end < len(stream) and stream[end]["role"] == "tool" and end > start + 1:
            end -= 1
        yield list(stream[start:end])
        start = end


def build(*, owner: Any, system: str, runs: Sequence[Sequence[dict[str, Any]]], size: int) -> Built:
    """A conversation with ``size`` messages of history (system message included),
    compacted after every batch."""
    from ctxsum.services import conversation_create

    started = time.perf_counter()
    conversation = conversation_create(
        owner=owner,
        title=f"prepare_call {size}",
        system=system,
        trigger={"messages": TRIGGER_MESSAGES},
        keep={"messages": KEEP_MESSAGES},
    )
    return compacted_by_batches(conversation, history_stream(runs, size - 1), started=started)


def compacted_by_batches(conversation: Any, stream: Sequence[Any], *, started: float) -> Built:
    """``conversation`` with ``stream`` appended in ``batches``, a forced compaction after
    each, as a ``Built`` (``started``: when the build began, for its seconds)."""
    from ctxsum.models import Summary
    from ctxsum.services import conversation_compact, message_append

    for batch in batches(stream):
        message_append(conversation=conversation, messages=batch)
        result = conversation_compact(conversation=conversation, force=True)
        if not result.compacted:
            raise RuntimeError(f"building: the compaction did not run: {result.reason}")
    conversation.refresh_from_db()
    return Built(
        conversation=conversation,
        history=conversation.message_count,
        summaries=Summary.objects.filter(conversation=conversation).count(),
        seconds=time.perf_counter() - started,
        counters={name: getattr(conversation, name) for name in COUNTERS},
    )


def rewind(built: Built) -> None:
    """Delete what the measured calls appended and restore the counters (untimed)."""
    from ctxsum.models import Conversation, Message

    conversation = built.conversation
    Message.objects.filter(conversation=conversation, seq__gte=built.counters["next_seq"]).delete()
    Conversation.objects.filter(pk=conversation.pk).update(**built.counters)
    for name, value in built.counters.items():
        setattr(conversation, name, value)


def kept_messages(context: Any) -> list[Mapping[str, Any]]:
    """The verbatim messages of a compacted context (after its system message and
    summary): LangChain's state holds the same ones."""
    skip = int(context.layout.leading) + int(context.summary is not None)
    return list(context.messages[skip:])
