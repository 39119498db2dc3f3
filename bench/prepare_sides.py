"""What "preparing one model call" is on each side: append one user message, then get the
messages to send. Each side is a ``Side``: ``call()`` does that once (timed), ``reset()``
puts the state back where it was (untimed), so every call starts from the same compacted
state.

- ctxsum ``append+context``: ``message_append`` then ``context_get``;
- ctxsum ``append+compact``: ``message_append`` then ``conversation_compact``, which finds
  the context below the trigger and returns it (what ``AUTO_COMPACT`` runs after an append);
- LangChain: the message added to the state with LangGraph's ``add_messages`` reducer, the
  middleware's ``before_model`` hook (it counts the state's tokens, then finds it below the
  trigger), then the system prompt put in front. Converting the messages to the provider's
  format, which the chat model integration does, is not included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.fixed_summary import FIXED_SUMMARY
from bench.prepare_state import Built, rewind

APPENDED = {
    "role": "user",
    "content": "Thanks. Could you also check whether the return flight on May 24 still has "
    "business class seats for two passengers, and what the difference in price would be?",
}


@dataclass
class Side:
    name: str
    call: Callable[[], Any]
    reset: Callable[[], None]


def ctxsum_sides(built: Built) -> list[Side]:
    from ctxsum.selectors import context_get
    from ctxsum.services import conversation_compact, message_append

    conversation = built.conversation

    def append_context() -> Any:
        message_append(conversation=conversation, messages=[dict(APPENDED)])
        return context_get(conversation=conversation).messages

    def append_compact() -> Any:
        message_append(conversation=conversation, messages=[dict(APPENDED)])
        result = conversation_compact(conversation=conversation)
        assert not result.compacted, "a measured call compacted"
        return result.context.messages

    def reset() -> None:
        rewind(built)

    return [
        Side("ctxsum append+context", append_context, reset),
        Side("ctxsum append+compact", append_compact, reset),
    ]


def langchain_sides(system: str, kept: Sequence[Mapping[str, Any]]) -> list[Side]:
    """The middleware with its default counter and with a tiktoken counter, on the state a
    compaction leaves: LangChain's summary message and the same kept messages as ctxsum."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from langgraph.graph.message import add_messages

    from bench.lc_fake import FixedSummaryChatModel, tiktoken_counter, to_langchain
    from bench.vs_lc import middleware

    summary = HumanMessage(
        content=f"Here is a summary of the conversation to date:\n\n{FIXED_SUMMARY}", id="summary"
    )
    state = [summary, *to_langchain(kept, first_index=1)]
    system_message = SystemMessage(content=system)

    def side(name: str, hook: Any) -> Side:
        def call() -> Any:
            messages = add_messages(state, [HumanMessage(content=APPENDED["content"])])
            update = hook.before_model({"messages": messages}, None)
            assert update is None, "a measured call summarized"
            return [system_message, *messages]

        return Side(name, call, lambda: None)

    return [
        side("LangChain default counter", middleware(FixedSummaryChatModel())),
        side(
            "LangChain tiktoken counter",
            middleware(FixedSummaryChatModel(), token_counter=tiktoken_counter),
        ),
    ]
