"""ctxsum as the memory of LangChain (``ctxsum.integrations.langchain``): the real
``create_agent`` runs an agent whose model (``ChatOpenAI``) is a local OpenAI-compatible
server, with ``CtxsumMiddleware``; ctxsum's summarizer is another local server and compacts
in the appending process. A few turns compact the conversation: the next model request is
sent the summary, not the archived turns, while the graph state keeps every message.
``CtxsumChatMessageHistory`` serves the same compacted context to LangChain's history API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from langchain.agents import create_agent
from langchain.agents.middleware import before_model, wrap_model_call
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

from ctxsum.conf import ctxsum_settings
from ctxsum.exceptions import MessagesInvalid
from ctxsum.integrations.langchain import CtxsumChatMessageHistory, CtxsumMiddleware
from ctxsum.models import Conversation, Summary
from ctxsum.selectors import context_get, transcript_list
from ctxsum.services import conversation_create
from tests.factories import FILLER
from tests.invariants import assert_context_invariants
from tests.support.examples import run_example

pytestmark = pytest.mark.django_db
SYSTEM = "You are a terse travel assistant."
POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}


def question(tag: str) -> str:
    """A user turn starting with ``tag``, long enough that a summary of it is a gain."""
    return f"{tag}: the traveller {FILLER}"


@pytest.fixture
def conversation(user) -> Conversation:
    return conversation_create(owner=user, system=SYSTEM, **POLICY)


@tool
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


def add_call(call_id: str, a: int, b: int) -> dict[str, Any]:
    arguments = json.dumps({"a": a, "b": b})
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}


def agent(server: Any, conversation: Conversation, *, checkpointer: bool = True, **options: Any):
    model = ChatOpenAI(model="gpt-4o", base_url=server.base_url, api_key="test", max_retries=0)
    return create_agent(
        model,
        tools=[add],
        middleware=[CtxsumMiddleware(conversation)],
        checkpointer=InMemorySaver() if checkpointer else None,
        **options,
    )


def sent(server: Any, index: int) -> list[dict[str, Any]]:
    """The messages of the model server's ``index``-th request."""
    return server.bodies[index]["messages"]


def text_of(messages: list[dict[str, Any]]) -> str:
    return json.dumps([message.get("content") for message in messages])


def is_summary(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return (
        message["role"] == "user"
        and isinstance(content, str)
        and content.startswith(ctxsum_settings.SUMMARY_PREFIX)
    )


def stored(conversation: Conversation) -> list[tuple[str, str]]:
    """Every stored message (archived ones too): role and content."""
    return [(row.role, row.content) for row in transcript_list(conversation=conversation)]


def three_turns(server: Any) -> None:
    """The model's answers to three turns: the first calls ``add`` then answers, the next
    two answer at once."""
    server.script = [
        {"tool_calls": [add_call("call_add_1", 2, 3)]},
        {"reply": "2 + 3 is 5."},
        {"reply": "Second answer."},
        {"reply": "Third answer."},
    ]


# --------------------------------------------------------------------------- the history


# The sync runner compacts once the append commits: no test transaction around it.
@pytest.mark.django_db(transaction=True)
def test_the_history_serves_the_compacted_context_and_the_transcript_keeps_everything(
    conversation, compacting
):
    history = CtxsumChatMessageHistory(conversation)
    history.add_messages(
        [
            HumanMessage(question("alpha")),
            AIMessage("", tool_calls=[{"id": "call_h1", "name": "add", "args": {"a": 1}}]),
            ToolMessage("1", tool_call_id="call_h1"),
            AIMessage("First answer."),
            HumanMessage(question("bravo")),
            AIMessage("Second answer."),
        ]
    )

    messages = history.messages
    assert isinstance(messages[0], SystemMessage) and messages[0].content == SYSTEM
    assert isinstance(messages[1], HumanMessage)
    assert messages[1].text.startswith(ctxsum_settings.SUMMARY_PREFIX)
    assert [(type(m), m.text) for m in messages[2:]] == [
        (HumanMessage, question("bravo")),
        (AIMessage, "Second answer."),
    ]
    assert "alpha" not in json.dumps([m.text for m in messages])
    assert compacting.bodies and Summary.objects.filter(conversation=conversation).count() == 1
    # The archived turns stay in the transcript, tool call and result included.
    assert [role for role, _ in stored(conversation)] == [
        "system", "user", "assistant", "tool", "assistant", "user", "assistant"
    ]  # fmt: skip
    assert async_to_sync(history.aget_messages)() == messages
    assert_context_invariants(conversation)


def test_tool_calls_round_trip_through_the_history(conversation):
    history = CtxsumChatMessageHistory(conversation)
    call = {"id": "call_rt", "name": "add", "args": {"a": 2, "b": 3}}

    async_to_sync(history.aadd_messages)(
        [
            HumanMessage("2 + 3?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage("5", tool_call_id="call_rt"),
        ]
    )

    _, question_, reply, result = history.messages
    assert question_.text == "2 + 3?"
    assert isinstance(reply, AIMessage) and reply.tool_calls == [{**call, "type": "tool_call"}]
    assert isinstance(result, ToolMessage) and result.tool_call_id == "call_rt"
    assert result.text == "5"
    row = transcript_list(conversation=conversation).get(role="assistant")
    assert row.tool_calls == [add_call("call_rt", 2, 3)]


def test_a_bad_message_raises_and_stores_nothing(conversation):
    history = CtxsumChatMessageHistory(conversation)
    batch = [HumanMessage("Hello"), ToolMessage("42", tool_call_id="call_nobody_made")]

    with pytest.raises(MessagesInvalid) as raised:
        history.add_messages(batch)

    assert "messages[1].tool_call_id" in raised.value.message_dict
    with pytest.raises(MessagesInvalid):
        async_to_sync(history.aadd_messages)(batch)
    assert stored(conversation) == [("system", SYSTEM)]
    history.add_messages([])  # nothing to add: nothing happens
    assert stored(conversation) == [("system", SYSTEM)]


def test_clear_starts_a_new_conversation_and_leaves_the_old_one_whole(conversation):
    history = CtxsumChatMessageHistory(conversation)
    history.add_messages([HumanMessage("Hello"), AIMessage("Hi.")])

    history.clear()

    assert history.conversation.pk != conversation.pk
    assert history.conversation.owner_id == conversation.owner_id
    assert history.conversation.trigger == POLICY["trigger"]
    assert [(type(m), m.text) for m in history.messages] == [(SystemMessage, SYSTEM)]
    assert stored(conversation) == [("system", SYSTEM), ("user", "Hello"), ("assistant", "Hi.")]
    first_restart = history.conversation
    async_to_sync(history.aclear)()
    assert history.conversation.pk not in (conversation.pk, first_restart.pk)
    assert Conversation.objects.filter(owner=conversation.owner).count() == 3


# --------------------------------------------------------------------------- the middleware


@pytest.mark.django_db(transaction=True)
def test_the_agent_is_sent_the_summary_while_its_state_keeps_every_message(
    conversation, compacting, model_server
):
    three_turns(model_server)
    graph = agent(model_server, conversation)
    config = {"configurable": {"thread_id": "t1"}}

    first = graph.invoke({"messages": [HumanMessage(question("turn one"))]}, config)
    assert first["messages"][-1].text == "2 + 3 is 5."
    assert not compacting.bodies  # five messages: under the trigger
    graph.invoke({"messages": [HumanMessage(question("turn two"))]}, config)
    third = graph.invoke({"messages": [HumanMessage(question("turn three"))]}, config)

    # Turn one: the system prompt, the question; then the tool call and its result.
    assert [m["role"] for m in sent(model_server, 0)] == ["system", "user"]
    assert sent(model_server, 0)[0]["content"] == SYSTEM
    assert [m["role"] for m in sent(model_server, 1)] == ["system", "user", "assistant", "tool"]
    assert sent(model_server, 1)[2]["tool_calls"] == [add_call("call_add_1", 2, 3)]
    assert sent(model_server, 1)[3] == {
        "role": "tool",
        "tool_call_id": "call_add_1",
        "content": "5",
    }
    # Turn two's append reached the trigger: compacted before the model was called.
    assert compacting.bodies
    for index in (2, 3):
        body = sent(model_server, index)
        assert body[0] == {"role": "system", "content": SYSTEM}
        assert is_summary(body[1])
        assert "turn one" not in text_of(body) and "call_add_1" not in json.dumps(body)
    assert sent(model_server, 3)[-1]["content"] == question("turn three")
    # The graph state was not summarized in place: every message is still there.
    assert [type(m) for m in third["messages"]] == [
        HumanMessage, AIMessage, ToolMessage, AIMessage,
        HumanMessage, AIMessage, HumanMessage, AIMessage,
    ]  # fmt: skip
    assert third["messages"][0].text == question("turn one")
    assert not any(ctxsum_settings.SUMMARY_PREFIX in m.text for m in third["messages"])
    # Each message stored once, however often the checkpointed state was read.
    assert [content for _, content in stored(conversation)][1:] == [
        m.text for m in third["messages"]
    ]
    assert stored(conversation)[-1] == ("assistant", "Third answer.")
    state = graph.get_state(config).values
    assert state["ctxsum_stored"] == [m.id for m in third["messages"]]
    assert_context_invariants(conversation)


def test_the_same_through_ainvoke(conversation, compacting, model_server):
    three_turns(model_server)
    graph = agent(model_server, conversation)
    config = {"configurable": {"thread_id": "async"}}

    for tag in ("turn one", "turn two", "turn three"):
        final = async_to_sync(graph.ainvoke)({"messages": [HumanMessage(question(tag))]}, config)

    assert len(model_server.bodies) == 4
    assert sent(model_server, 1)[3]["tool_call_id"] == "call_add_1"
    for index in (2, 3):
        body = sent(model_server, index)
        assert body[0]["content"] == SYSTEM and is_summary(body[1])
        assert "turn one" not in text_of(body)
    assert len(final["messages"]) == 8 and final["messages"][0].text == question("turn one")
    assert len(stored(conversation)) == 9
    # The hooks' async twins ran: the compaction went through the async client.
    clients = [request["headers"].get("user-agent", "") for request in compacting.requests]
    assert clients and all(client.startswith("AsyncOpenAI/") for client in clients)
    assert_context_invariants(conversation)


def test_without_a_checkpointer_the_conversation_is_the_memory(conversation, model_server):
    model_server.script = [{"reply": "Noted: Lyon."}, {"reply": "You are going to Lyon."}]
    graph = agent(model_server, conversation, checkpointer=False)

    graph.invoke({"messages": [HumanMessage("I am going to Lyon.")]})
    second = graph.invoke({"messages": [HumanMessage("Where am I going?")]})

    assert [m.text for m in second["messages"]] == ["Where am I going?", "You are going to Lyon."]
    assert [m["content"] for m in sent(model_server, 1)] == [
        SYSTEM, "I am going to Lyon.", "Noted: Lyon.", "Where am I going?"
    ]  # fmt: skip
    assert len(stored(conversation)) == 5


def test_the_conversations_system_prompt_replaces_the_agents(conversation, model_server):
    graph = agent(model_server, conversation, system_prompt="The agent's own prompt.")

    graph.invoke({"messages": [HumanMessage("Hello")]}, {"configurable": {"thread_id": "p"}})

    assert sent(model_server, 0) == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hello"},
    ]


def test_without_one_the_agents_system_prompt_is_sent(user, model_server):
    bare = conversation_create(owner=user)
    graph = agent(model_server, bare, system_prompt="The agent's own prompt.")

    graph.invoke({"messages": [HumanMessage("Hello")]}, {"configurable": {"thread_id": "q"}})

    assert [m["content"] for m in sent(model_server, 0)] == ["The agent's own prompt.", "Hello"]
    assert stored(bare)[0] == ("user", "Hello")  # the agent's prompt is not the conversation's


def test_messages_other_middleware_add_follow_the_context(conversation, model_server):
    @wrap_model_call
    def one_call_only(request, handler):  # outer: adds to this model call only
        return handler(request.override(messages=[*request.messages, HumanMessage("(aside)")]))

    @before_model
    def reminder(state, runtime):  # after CtxsumMiddleware's own before_model
        return {"messages": [HumanMessage("Reminder: be brief.")]}

    model = ChatOpenAI(model="gpt-4o", base_url=model_server.base_url, api_key="test")
    middleware = [one_call_only, CtxsumMiddleware(conversation), reminder]
    graph = create_agent(model, middleware=middleware, checkpointer=InMemorySaver())

    graph.invoke({"messages": [HumanMessage("Hello")]}, {"configurable": {"thread_id": "m"}})

    assert [m["content"] for m in sent(model_server, 0)] == [
        SYSTEM, "Hello", "Reminder: be brief.", "(aside)"
    ]  # fmt: skip
    # The reminder joined the state, so it is stored; the aside was for that call only.
    assert [content for _, content in stored(conversation)][1:3] == ["Hello", "Reminder: be brief."]
    assert "(aside)" not in json.dumps(stored(conversation))


def test_a_bad_message_stops_the_agent_before_the_model_and_stores_nothing(
    conversation, model_server
):
    graph = agent(model_server, conversation)
    orphan = ToolMessage("42", tool_call_id="call_nobody_made")

    with pytest.raises(MessagesInvalid):
        graph.invoke(
            {"messages": [HumanMessage("Hello"), orphan]}, {"configurable": {"thread_id": "bad"}}
        )

    assert not model_server.bodies
    assert stored(conversation) == [("system", SYSTEM)]


def test_a_tool_call_with_malformed_arguments_is_left_out_of_the_conversation(
    conversation, model_server
):
    malformed = {
        "id": "call_bad",
        "type": "function",
        "function": {"name": "add", "arguments": "{"},
    }
    model_server.script = [{"tool_calls": [malformed]}, {"reply": "Sorry, say again?"}]
    graph = agent(model_server, conversation)
    config = {"configurable": {"thread_id": "malformed"}}

    graph.invoke({"messages": [HumanMessage("2 + 3?")]}, config)
    final = graph.invoke({"messages": [HumanMessage("Two plus three?")]}, config)

    # LangChain answers the call it could not parse with an error result in its state...
    assert any(
        isinstance(m, ToolMessage) and m.tool_call_id == "call_bad" for m in final["messages"]
    )
    # ...which answers no call ctxsum holds: neither stored nor sent.
    assert "call_bad" not in json.dumps(model_server.bodies[1])
    assert [role for role, _ in stored(conversation)] == [
        "system", "user", "assistant", "user", "assistant"
    ]  # fmt: skip
    assert context_get(conversation=conversation).messages[-1]["content"] == "Sorry, say again?"


# --------------------------------------------------------------------------- the example


# What a real model might answer: long enough that six turns reach the example's trigger.
EXAMPLE_REPLY = (
    "Estrela and Campo de Ourique are quiet, with tram 28 and tram 25 close by; hotels there "
    "often fit a budget of 120 euros a night in June. I would book the fado dinner in Alfama "
    "for June 15 and keep June 17 for Sintra by train from Rossio."
)


@pytest.mark.slow
def test_the_example_runs_and_compacts(model_server, tmp_path):
    model_server.reply = EXAMPLE_REPLY
    result = run_example("langchain_agent.py", base_url=model_server.base_url, tmp_path=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "compacted: yes" in result.stdout
    assert model_server.bodies and any(
        is_summary(message) for message in model_server.bodies[-1]["messages"]
    )
