"""LangChain v1's SummarizationMiddleware on one recorded conversation, driven the way an
agent loop drives it: before every model call (each recorded assistant turn) its
``before_model`` hook sees the state's messages, its update is applied with LangGraph's own
``add_messages`` reducer, and the model is sent the state (behind the system prompt when the
agent was given one). The model's answer, and every tool result or user turn after it, are
then added to the state, as the agent loop does.

Two ways to hand LangChain the recorded system message:

- ``system_prompt``: ``create_agent(system_prompt=...)``, the documented way. The middleware
  never sees it; the agent prepends it to every model call.
- ``in_state``: the system message is the first message of the state (the history loaded
  into ``messages``, as a chat application that stores the whole conversation would). The
  middleware then summarizes it like any other message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain.agents.middleware import SummarizationMiddleware
from langgraph.graph.message import add_messages

from bench.common import KEEP_MESSAGES, TRIGGER_MESSAGES
from bench.lc_fake import FixedSummaryChatModel, summary_call_tokens, to_langchain
from bench.vs_sides import Call, SideResult, call_indices, has_system
from ctxsum import tokens

MODES = ("system_prompt", "in_state")


def middleware(model: FixedSummaryChatModel, **options: Any) -> SummarizationMiddleware:
    """The middleware with the benchmark's policy (trigger 12 messages, keep 6)."""
    return SummarizationMiddleware(
        model=model,
        trigger=("messages", TRIGGER_MESSAGES),
        keep=("messages", KEEP_MESSAGES),
        **options,
    )


def sent_tokens(state: Sequence[Any], counts: Sequence[int]) -> tuple[int, int]:
    """Tokens of the state as sent, and of the system message in it: a recorded message
    costs what it cost in the recording (its id ``m<index>`` says which), anything else
    (LangChain's summary message) is counted from its text as a user message."""
    total = system = 0
    for message in state:
        identifier = message.id or ""
        if identifier.startswith("m"):
            cost = counts[int(identifier[1:])]
            if identifier == "m0" and message.type == "system":
                system = cost
        else:
            cost = tokens.count_message({"role": "user", "content": message.text})
        total += cost
    return tokens.context_tokens([total]), system


def run_langchain(
    messages: Sequence[Mapping[str, Any]],
    counts: Sequence[int],
    *,
    mode: str,
    observe: Callable[[Call, list[Any]], None] | None = None,
) -> SideResult:
    """Replay ``messages`` through the middleware; see the module docstring for ``mode``.
    ``observe`` is shown every call and the LangChain messages it was sent (the system
    prompt not included in ``system_prompt`` mode)."""
    model = FixedSummaryChatModel()
    hook = middleware(model)
    pinned = has_system(messages)
    prompt_cost = counts[0] if pinned and mode == "system_prompt" else 0
    first = 1 if prompt_cost else 0
    originals = to_langchain(messages[first:], first_index=first)
    result = SideResult(system_kept=True if pinned else None)
    state: list[Any] = []
    done = first
    for index in call_indices(messages):
        state = add_messages(state, originals[done - first : index - first])
        done = index
        update = hook.before_model({"messages": state}, None)  # type: ignore[arg-type]
        if update is not None:
            state = add_messages(state, update["messages"])
            result.summaries += 1
        sent, system = sent_tokens(state, counts)
        if prompt_cost:
            sent, system = sent + prompt_cost, prompt_cost
        result.calls.append(Call(index, sent, system))
        if observe is not None:
            observe(result.calls[-1], list(state))
        if pinned and not system:
            result.system_kept = False
    for received in model.received:
        sent_in, sent_out = summary_call_tokens(received)
        result.summarizer_in += sent_in
        result.summarizer_out += sent_out
    result.summarizer_calls = len(model.received)
    return result
