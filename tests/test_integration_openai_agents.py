"""ctxsum as the memory of the OpenAI Agents SDK (``ctxsum.integrations.openai_agents``):
the real SDK's ``Runner`` runs an agent whose model is a local OpenAI-compatible server,
with a ``CtxsumSession``; ctxsum's summarizer is another local server. Six turns compact
the conversation, and the next model call is sent the summary, not the archived turns."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError
from openai import AsyncOpenAI

from ctxsum.conf import ctxsum_settings
from ctxsum.integrations.openai_agents import CtxsumSession, as_items, as_messages
from ctxsum.models import Conversation, Message, Summary
from ctxsum.selectors import context_get, transcript_list
from ctxsum.services import conversation_compact, conversation_create, message_append
from tests.factories import long_user_message
from tests.invariants import assert_context_invariants
from tests.support.examples import run_example

pytestmark = pytest.mark.django_db
POLICY = {"trigger": {"messages": 8}, "keep": {"messages": 3}}
QUESTION = "Question {n}: which trains leave for Lyon tomorrow morning, and which are cheapest?"


@pytest.fixture(autouse=True)
def _no_tracing():
    set_tracing_disabled(True)


@function_tool
def timetable(city: str) -> str:
    """The day's trains to ``city``."""
    return f"Trains to {city}: 07:04, 08:12, 09:30."


def travel_agent(server: Any) -> Agent:
    client = AsyncOpenAI(base_url=server.base_url, api_key="test")
    return Agent(
        name="travel",
        instructions="Answer in one sentence.",
        model=OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client),
        tools=[timetable],
    )


def call(call_id: str, city: str = "Lyon") -> dict[str, Any]:
    arguments = json.dumps({"city": city})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "timetable", "arguments": arguments},
    }


def run(agent: Agent, text: str, session: CtxsumSession) -> str:
    result = async_to_sync(Runner.run)(agent, text, session=session)
    return str(result.final_output)


def sent(body: dict[str, Any]) -> str:
    """Everything a model request sent, as one text."""
    return json.dumps(body["messages"])


def test_six_turns_compact_and_the_next_call_gets_the_summary(user, compacting, model_server):
    conversation = conversation_create(owner=user, system="You plan train trips.", **POLICY)
    session = CtxsumSession(conversation)
    agent = travel_agent(model_server)
    # The first turn calls the tool, then answers; every other turn answers at once.
    model_server.script = [{"tool_calls": [call("call_1")]}, {"reply": "The 07:04 is cheapest."}]
    model_server.reply = "Take the 08:12."

    replies = [run(agent, QUESTION.format(n=n), session) for n in range(5)]
    summary = Summary.objects.filter(conversation=conversation, active=True).first()
    assert summary is not None, "five turns never compacted"
    archived = Message.objects.filter(conversation=conversation).archived()
    first_question = archived.get(seq=1).content
    replies.append(run(agent, QUESTION.format(n=5), session))

    assert replies[0] == "The 07:04 is cheapest." and replies[5] == "Take the 08:12."
    # The sixth turn's model call: the summary in, the archived first question out.
    last = sent(model_server.bodies[-1])
    assert ctxsum_settings.SUMMARY_PREFIX in last and json.dumps(summary.text)[1:-1] in last
    assert first_question == QUESTION.format(n=0) and first_question not in last
    assert QUESTION.format(n=5) in last
    assert "You plan train trips." in last  # the conversation's system prompt, kept
    # Every message stays in the transcript, the tool round as an assistant message with
    # its tool call and the tool's result.
    rows = list(transcript_list(conversation=conversation))
    assert len(rows) == 1 + 6 * 2 + 2
    assert rows[2].tool_calls[0]["id"] == "call_1" and rows[3].tool_call_id == "call_1"
    assert "07:04, 08:12" in rows[3].content
    assert any(row.summary_id for row in rows) and rows[0].summary_id is None
    assert_context_invariants(conversation)


def test_get_items_serves_the_compacted_context(user, compacting):
    history = [long_user_message(f"u{n}") for n in range(7)]
    conversation = conversation_create(owner=user, system="S.", messages=history, **POLICY)
    assert conversation_compact(conversation=conversation, force=True).compacted
    session = CtxsumSession(conversation)

    items = async_to_sync(session.get_items)()

    context = context_get(conversation=conversation).messages
    assert items[0] == {"role": "system", "content": "S."}
    assert items[1]["content"].startswith(ctxsum_settings.SUMMARY_PREFIX)
    assert [item["content"] for item in items] == [message["content"] for message in context]
    assert async_to_sync(session.get_items)(limit=2) == items[-2:]
    assert async_to_sync(session.get_items)(limit=0) == []


def test_items_round_trip_through_stored_messages(user):
    conversation = conversation_create(owner=user, system="S.")
    session = CtxsumSession(conversation)
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Trains?"}]},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Looking.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "timetable", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "timetable", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "07:04"},
        {"type": "function_call_output", "call_id": "c2", "output": "08:12"},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # not stored
        {"role": "assistant", "content": "The 07:04."},
    ]

    async_to_sync(session.add_items)(items)

    stored = [row.as_openai() for row in transcript_list(conversation=conversation)][1:]
    assert [message["role"] for message in stored] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert [c["id"] for c in stored[1]["tool_calls"]] == ["c1", "c2"]
    assert stored[1]["content"] == "Looking."
    served = async_to_sync(session.get_items)()[1:]
    assert served == [
        {"role": "user", "content": [{"type": "input_text", "text": "Trains?"}]},
        {"role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "c1", "name": "timetable", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "timetable", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "07:04"},
        {"type": "function_call_output", "call_id": "c2", "output": "08:12"},
        {"role": "assistant", "content": "The 07:04."},
    ]
    # Served items are valid input again: the text and the calls as two assistant messages.
    again = as_messages(served)
    assert [m["role"] for m in again] == [
        "user",
        "assistant",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert again[2]["tool_calls"] == stored[1]["tool_calls"]
    copy = conversation_create(owner=user, messages=again)
    assert copy.message_count == 6


def test_image_and_file_parts_become_input_parts():
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "This?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "file", "file": {"file_id": "file-1"}},
            ],
        }
    ]
    assert as_items(messages)[0]["content"] == [
        {"type": "input_text", "text": "This?"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
        {"type": "input_file", "file_id": "file-1"},
    ]


def test_a_refused_batch_stores_nothing(user):
    conversation = conversation_create(owner=user, system="S.")
    session = CtxsumSession(conversation)
    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call_output", "call_id": "nobody", "output": "42"},
    ]
    with pytest.raises(ValidationError, match="nobody"):
        async_to_sync(session.add_items)(items)
    assert Message.objects.filter(conversation=conversation).count() == 1


def test_pop_item_takes_back_the_newest_message_and_never_the_system_prompt(user):
    conversation = conversation_create(owner=user, system="S.")
    session = CtxsumSession(conversation)
    async_to_sync(session.add_items)(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."}]
    )

    assert async_to_sync(session.pop_item)() == {"role": "assistant", "content": "Hello."}
    assert async_to_sync(session.pop_item)() == {"role": "user", "content": "hi"}
    assert async_to_sync(session.pop_item)() is None
    assert async_to_sync(session.get_items)() == [{"role": "system", "content": "S."}]


def test_pop_item_of_a_tool_round_returns_its_last_call(user):
    conversation = conversation_create(owner=user)
    session = CtxsumSession(conversation)
    async_to_sync(session.add_items)(
        [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "timetable", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "timetable", "arguments": "{}"},
        ]
    )
    popped = async_to_sync(session.pop_item)()
    assert popped == {
        "type": "function_call",
        "call_id": "c2",
        "name": "timetable",
        "arguments": "{}",
    }
    assert async_to_sync(session.get_items)() == [{"role": "user", "content": "hi"}]


def test_clear_session_goes_on_in_a_new_conversation_and_keeps_the_old_one(user, compacting):
    history = [long_user_message(f"u{n}") for n in range(7)]
    old = conversation_create(owner=user, system="S.", messages=history, **POLICY)
    assert conversation_compact(conversation=old, force=True).compacted
    session = CtxsumSession(old)

    async_to_sync(session.clear_session)()

    assert session.conversation.pk != old.pk and session.session_id == str(session.conversation.pk)
    assert async_to_sync(session.get_items)() == [{"role": "system", "content": "S."}]
    assert Message.objects.filter(conversation=old).count() == 8
    assert Summary.objects.filter(conversation=old).count() == 1
    async_to_sync(session.add_items)([{"role": "user", "content": "again"}])
    assert Conversation.objects.get(pk=session.conversation.pk).message_count == 2


def test_a_session_works_beside_the_sync_api(user):
    """Messages appended elsewhere (the REST API, message_append) are in the next run."""
    conversation = conversation_create(owner=user)
    message_append(conversation=conversation, messages=[{"role": "user", "content": "from REST"}])
    items = async_to_sync(CtxsumSession(conversation).get_items)()
    assert items == [{"role": "user", "content": "from REST"}]


@pytest.mark.slow
def test_the_example_runs_and_compacts(model_server, tmp_path):
    # A real model's replies are a few sentences: short ones would not pay for a summary.
    model_server.reply = (
        "Lyon's old town, Vieux Lyon, is a maze of Renaissance lanes and traboules; start at "
        "Fourviere hill for the view, then walk down to Saint-Jean cathedral and along the "
        "Saone. "
    ) * 3
    done = run_example(
        "openai_agents_session.py", base_url=model_server.base_url, tmp_path=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "compacted: yes" in done.stdout, done.stdout
