"""The two sides of one chat turn in ``bench.vs_langgraph``, on the same PostgreSQL database,
with the same policy (trigger 12 messages, keep 6), the same user message, the same fixed
reply and the same fixed 120-token summary:

- **ctxsum**, with its default settings (``AUTO_COMPACT`` on, ``COMPACTION_RUNNER =
  "tasks"`` with the django-tasks database backend) but the fixed summarizer: a turn is
  ``message_append`` (the user message), ``context_get`` (what the model is sent),
  ``message_append`` (the reply). The append that reaches the trigger enqueues the
  compaction task; ``run_worker`` then runs it as ``manage.py db_worker`` does (its
  ``Worker``, in this process, until no task is ready), and again for the check the task
  defers for a lease's time later (``checks_due`` makes it due at once, untimed).
- **LangGraph**: ``create_agent`` with ``SummarizationMiddleware`` and LangGraph's
  ``PostgresSaver``, one thread per conversation; a turn is ``agent.invoke`` of the user
  message, which loads the thread's checkpoint, runs the middleware (summarizing inline
  when due, with the fake model of bench/lc_fake.py), calls the model (a fake that writes
  the fixed reply) and writes the checkpoints.

Both are built with the same history: the agent runs' messages, then ``TAIL`` (three turns
like the measured ones), in batches of at most 1,000, each compacted (ctxsum:
``conversation_compact(force=True)``, as bench/prepare_state.py does) or summarized
(LangGraph: the batch is the input of an ``invoke``, which summarizes it and answers). Then
ctxsum's context is the system message, the summary and the tail's last 6 messages: 8
messages, 2 more a turn, so the reply of every 2nd turn reaches 12 and enqueues the
compaction. LangGraph's state is the summary, the same 6 and the answer to the last batch:
its model calls see 9, 11 and 13 messages in the next three turns, so it summarizes in every
3rd turn. Django must be set up on PostgreSQL."""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from bench.common import POLICY
from bench.lc_fake import FixedSummaryChatModel, to_langchain
from bench.prepare_sides import APPENDED
from bench.prepare_state import Built, batches, compacted_by_batches, history_stream
from bench.vs_lc import middleware

USER = dict(APPENDED)
REPLY = {
    "role": "assistant",
    "content": "Yes: the return flight on May 24 still has business class seats for two. "
    "Changing both tickets costs 420 EUR more per passenger, 840 EUR in all, taxes "
    "included. Shall I book them and send the new confirmation to the same address?",
}
# The last messages of every history: three turns like the measured ones.
TAIL = (USER, REPLY) * 3
LANGGRAPH_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations")
WORKER_ID = "bench-vs-langgraph"


class FixedReplyChatModel(BaseChatModel):
    """The agent's model: answers every call with ``REPLY``'s text."""

    @property
    def _llm_type(self) -> str:
        return "fixed-reply-fake"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        reply = AIMessage(content=REPLY["content"])
        return ChatResult(generations=[ChatGeneration(message=reply)])


# ctxsum


def history(runs: Sequence[Sequence[dict[str, Any]]], size: int) -> list[dict[str, Any]]:
    """``size - 1`` messages (a few more when the cut moved past a tool result): the agent
    runs' messages, then ``TAIL``, so that what a compaction keeps is the same on both
    sides and the compactions come at known turns (module docstring)."""
    body = size - 1 - len(TAIL)
    return [*(history_stream(runs, body) if body > 0 else []), *(dict(m) for m in TAIL)]


def ctxsum_build(
    *, owner: Any, system: str, runs: Sequence[Sequence[dict[str, Any]]], size: int
) -> Built:
    """A conversation of ``size`` messages with the system message, compacted (forced)
    after every batch, as bench/prepare_state.py builds them; no automatic compaction
    while it is built."""
    from django.conf import settings
    from django.test import override_settings

    from ctxsum.services import conversation_create

    started = time.perf_counter()
    with override_settings(CTXSUM={**settings.CTXSUM, "AUTO_COMPACT": False}):
        conversation = conversation_create(
            owner=owner, title=f"vs_langgraph {size}", system=system, **POLICY
        )
        return compacted_by_batches(conversation, history(runs, size), started=started)


def ctxsum_turn(built: Built) -> bool:
    """One turn; whether one of its appends enqueued the compaction."""
    from ctxsum.policy import Reason
    from ctxsum.selectors import context_get
    from ctxsum.services import message_append

    conversation = built.conversation
    asked = message_append(conversation=conversation, messages=[dict(USER)])
    context_get(conversation=conversation)
    answered = message_append(conversation=conversation, messages=[dict(REPLY)])
    return any(
        appended.compaction is not None and appended.compaction.reason == Reason.QUEUED
        for appended in (asked, answered)
    )


def run_worker() -> int:
    """``manage.py db_worker --batch``'s loop in this process: every ready task of the
    default queue, then return; the tasks run."""
    from django_tasks_db.management.commands.db_worker import Worker

    worker = Worker(
        queue_names=["default"],
        interval=0,
        batch=True,
        backend_name="default",
        startup_delay=False,
        max_tasks=None,
        worker_id=WORKER_ID,
        excluded_queue_names=[],
    )
    worker.run()
    return worker._run_tasks


def checks_due() -> int:
    """Make the checks the compaction tasks deferred (a lease's time later) due now; the
    number made due. Untimed: the clock is moved, not the work."""
    from django.utils import timezone
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult.objects.filter(status="READY").update(run_after=timezone.now())


def task_outcomes(since: datetime.datetime) -> list[str]:
    """What every task that finished since ``since`` returned (its reason), oldest first.
    The rows stay, as they do until ``prune_db_task_results`` runs."""
    from django_tasks_db.models import DBTaskResult

    finished = DBTaskResult.objects.filter(finished_at__gte=since).order_by("finished_at")
    return [f"{row.status}:{(row.return_value or {}).get('reason', '')}" for row in finished]


@contextmanager
def kept_connection() -> Iterator[None]:
    """Keep Django's connection open across the worker's loop for the block, as a
    long-running worker does (``CONN_MAX_AGE = None``): its ``close_old_connections`` would
    otherwise close it after every task, and the next turn would pay for a new connection."""
    from django.db import connection

    before = connection.settings_dict.get("CONN_MAX_AGE", 0)
    connection.settings_dict["CONN_MAX_AGE"] = None
    connection.close()
    try:
        yield
    finally:
        connection.settings_dict["CONN_MAX_AGE"] = before
        connection.close()


# LangGraph


@dataclass
class Agent:
    """The agent graph on a checkpointer, the fake summary model (its calls counted)."""

    graph: Any
    summaries: FixedSummaryChatModel
    saver: Any
    threads: dict[int, dict[str, Any]] = field(default_factory=dict)

    def config(self, size: int) -> dict[str, Any]:
        return self.threads[size]


@contextmanager
def langgraph_agent(url: str, system: str) -> Iterator[Agent]:
    """The agent on ``PostgresSaver.from_conn_string(url)`` (its tables set up), its
    system prompt the conversations' system message."""
    from langchain.agents import create_agent
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        summaries = FixedSummaryChatModel()
        graph = create_agent(
            FixedReplyChatModel(),
            system_prompt=system,
            middleware=[middleware(summaries)],
            checkpointer=saver,
        )
        yield Agent(graph=graph, summaries=summaries, saver=saver)


def langgraph_build(agent: Agent, *, runs: Sequence[Sequence[dict[str, Any]]], size: int) -> int:
    """A thread with ``size - 1`` messages of history (the ctxsum conversation's, without
    its system message), each batch the input of one ``invoke`` that summarizes it and
    answers; the messages the thread went through (the answers included)."""
    config = {"configurable": {"thread_id": f"vs-langgraph-{size}-{uuid.uuid4().hex[:8]}"}}
    agent.threads[size] = config
    given = answers = 0
    for batch in batches(history(runs, size)):
        agent.graph.invoke({"messages": to_langchain(batch, first_index=given)}, config=config)
        given, answers = given + len(batch), answers + 1
    return given + answers


def langgraph_turn(agent: Agent, size: int) -> bool:
    """One turn; whether the middleware summarized in it."""
    from langchain_core.messages import HumanMessage

    before = len(agent.summaries.received)
    agent.graph.invoke({"messages": [HumanMessage(content=USER["content"])]}, agent.config(size))
    return len(agent.summaries.received) > before


def langgraph_drop(url: str) -> None:
    """Drop the checkpointer's tables (a test database outlives the test)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        for table in LANGGRAPH_TABLES:
            connection.execute(f"drop table if exists {table}")
