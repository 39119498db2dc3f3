"""ctxsum as the memory of LangChain (``pip install ctxsum[langchain]``: ``langchain`` v1).

Two ways in, both storing through ``ctxsum.services`` and reading through
``ctxsum.selectors``:

- ``CtxsumChatMessageHistory(conversation)``: a ``BaseChatMessageHistory`` (for
  ``RunnableWithMessageHistory`` and any code that reads and adds messages). Its
  ``messages`` are the conversation's *active context*, not its transcript: the leading
  system message, then the summary of the archived messages (a user message that starts
  with ``SUMMARY_PREFIX``) and the key facts block when there are, then the messages kept
  verbatim. ``add_messages`` appends in one ``message_append``, after which the automatic
  compaction may run.

- ``CtxsumMiddleware(conversation)``: an ``AgentMiddleware`` for ``create_agent``. Every
  message of the agent's state is stored in the conversation (before each model call, and
  at the end of the run), and the model is sent the conversation's active context in place
  of the state. Unlike LangChain's ``SummarizationMiddleware``, it never rewrites the graph
  state: with a checkpointer the state keeps every message, while the model sees the
  summary and the newest messages. Without a checkpointer, pass only the new messages to
  each ``invoke``: the conversation is the memory.

Clearing: ctxsum never deletes the history a summary covers, so
``CtxsumChatMessageHistory.clear()`` (and ``aclear()``) starts over on a *new* conversation
(``conversation_restart``: same owner, settings and system prompt) and switches the history
to it (its ``conversation`` attribute); the old conversation keeps every message.

Messages cross over with LangChain's own converters (``convert_to_openai_messages``,
``convert_to_messages``). A bad message (a tool result that answers no call of the
conversation, say) raises ctxsum's ``ValidationError`` (``MessagesInvalid``) and stores
nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, cast

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ModelCallResult,
    ModelRequest,
    ModelResponse,
)
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langgraph.runtime import Runtime

from ctxsum.selectors import ActiveContext, acontext_get, context_get
from ctxsum.services import (
    aconversation_restart,
    amessage_append,
    conversation_restart,
    message_append,
)

if TYPE_CHECKING:
    from ctxsum.models import Conversation

__all__ = ["CtxsumChatMessageHistory", "CtxsumMiddleware", "CtxsumState"]


# --------------------------------------------------------------------------- conversions


def to_openai(messages: Iterable[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as the OpenAI chat dicts ctxsum stores (LangChain's converter:
    it leaves out an AI message's invalid tool calls)."""
    return convert_to_openai_messages(list(messages))


def to_langchain(messages: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    """ctxsum's OpenAI chat dicts as LangChain messages."""
    return convert_to_messages(messages)


def context_split(context: ActiveContext) -> tuple[SystemMessage | None, list[BaseMessage]]:
    """The context's leading system message (if it has one) and what follows it: the
    summary, the key facts block and the messages kept verbatim."""
    messages = to_langchain(context.messages)
    if context.leading_row is None:
        return None, messages
    return cast("SystemMessage", messages[0]), messages[1:]


# --------------------------------------------------------------------------- the history


class CtxsumChatMessageHistory(BaseChatMessageHistory):
    """A chat message history kept in a ctxsum conversation.

    ``messages`` is the active context: the leading system message, the summary and key
    facts when there are, then the messages kept verbatim; ``transcript_list`` still
    returns every message. ``clear()`` switches to a new conversation (see ``clear``).
    """

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The active context, as LangChain messages."""
        return to_langchain(context_get(conversation=self.conversation).messages)

    async def aget_messages(self) -> list[BaseMessage]:
        """``messages`` for async code."""
        context = await acontext_get(conversation=self.conversation)
        return to_langchain(context.messages)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` in one ``message_append``, all or none (ValidationError on a
        bad one); the automatic compaction may follow. No messages: nothing happens."""
        if messages:
            message_append(conversation=self.conversation, messages=to_openai(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """``add_messages`` for async code (``amessage_append``)."""
        if messages:
            await amessage_append(conversation=self.conversation, messages=to_openai(messages))

    def clear(self) -> None:
        """Start over on a new conversation and switch to it: ``conversation_restart``
        makes one with the same owner, title, settings, policy and system prompt, and
        ``conversation`` becomes it. Nothing is deleted: the old conversation keeps its
        transcript and summaries (ctxsum never deletes history a summary covers)."""
        self.conversation = conversation_restart(conversation=self.conversation)

    async def aclear(self) -> None:
        """``clear`` for async code (``aconversation_restart``)."""
        self.conversation = await aconversation_restart(conversation=self.conversation)


# --------------------------------------------------------------------------- the middleware


class CtxsumState(AgentState[Any]):
    """The agent's state with the middleware's bookkeeping: the ids of the state's messages
    it has handed to ctxsum (stored, or left out on purpose). Private: neither the agent's
    input nor its output shows it."""

    ctxsum_stored: NotRequired[Annotated[list[str], PrivateStateAttr]]


def invalid_call_ids(messages: Iterable[BaseMessage]) -> set[str]:
    """The ids of the AI messages' invalid tool calls (arguments that did not parse).
    LangChain's converter leaves those calls out, so ctxsum never holds them; the error
    results the agent adds for them answer no stored call and are left out too."""
    calls = (
        call["id"]
        for message in messages
        if isinstance(message, AIMessage)
        for call in message.invalid_tool_calls
    )
    return {call_id for call_id in calls if call_id is not None}


def unstored(messages: Sequence[BaseMessage], stored: Collection[str]) -> list[BaseMessage]:
    """The messages ctxsum does not hold yet, in order: those whose id is not in
    ``stored``, less the results of invalid tool calls."""
    invalid = invalid_call_ids(messages)
    return [
        message
        for message in messages
        if message.id not in stored
        and not (isinstance(message, ToolMessage) and message.tool_call_id in invalid)
    ]


def stored_ids(messages: Iterable[BaseMessage]) -> list[str]:
    """What ``ctxsum_stored`` becomes once ``messages`` are all handed over."""
    return [message.id for message in messages if message.id is not None]


class CtxsumMiddleware(AgentMiddleware[CtxsumState, Any, Any]):
    """Keeps an agent's messages in a ctxsum conversation and sends the model the
    conversation's active context instead of the agent's state.

    - ``before_model`` stores the state's messages ctxsum does not hold yet (the user's
      turn, the last reply and its tool results) in one ``message_append``, which may
      compact; ``after_agent`` stores the final reply. ``ctxsum_stored`` (private state)
      lists the ids of the messages handed over, so a message is stored once however often
      the state is read, with a checkpointer across invokes too.
    - ``wrap_model_call`` sends ``context_get``'s messages: the conversation's leading
      system message becomes the request's ``system_message`` (else the agent's own, from
      ``create_agent(system_prompt=...)``, stays); the summary, the key facts block and the
      kept messages become ``messages``, followed by any message of the request ctxsum does
      not hold (one a middleware added for this call only). The graph state is never
      rewritten.

    Put it first in ``middleware=[...]``: the middleware after it then see, and may adjust,
    the context it sends. Do not combine it with a middleware that rewrites the state's
    messages (``SummarizationMiddleware``): ctxsum does that job, without losing them.
    """

    state_schema = CtxsumState

    def __init__(self, conversation: Conversation) -> None:
        super().__init__()
        self.conversation = conversation

    # --- storing

    def _pending(self, state: CtxsumState) -> tuple[list[BaseMessage], dict[str, Any] | None]:
        """The state's messages to store, and the state update that records them (None:
        nothing changed)."""
        messages = state["messages"]
        stored = state.get("ctxsum_stored", [])
        handed = stored_ids(messages)
        if handed == stored:
            return [], None
        return unstored(messages, set(stored)), {"ctxsum_stored": handed}

    def _store(self, state: CtxsumState) -> dict[str, Any] | None:
        pending, update = self._pending(state)
        if pending:
            message_append(conversation=self.conversation, messages=to_openai(pending))
        return update

    async def _astore(self, state: CtxsumState) -> dict[str, Any] | None:
        pending, update = self._pending(state)
        if pending:
            await amessage_append(conversation=self.conversation, messages=to_openai(pending))
        return update

    def before_model(self, state: CtxsumState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Store the messages that joined the state since the last model call."""
        return self._store(state)

    async def abefore_model(
        self, state: CtxsumState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await self._astore(state)

    def after_agent(self, state: CtxsumState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Store the run's last messages (the final reply)."""
        return self._store(state)

    async def aafter_agent(
        self, state: CtxsumState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await self._astore(state)

    # --- what the model is sent

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult[Any]:
        """Call the model with the conversation's active context."""
        return handler(with_context(request, context_get(conversation=self.conversation)))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult[Any]:
        context = await acontext_get(conversation=self.conversation)
        return await handler(with_context(request, context))


def with_context(request: ModelRequest[Any], context: ActiveContext) -> ModelRequest[Any]:
    """``request`` with ``context`` as its system message and messages: the leading system
    message replaces the agent's (kept when the conversation has none), and the request's
    messages ctxsum does not hold follow the context."""
    system, messages = context_split(context)
    stored = cast("CtxsumState", request.state).get("ctxsum_stored", [])
    extra = unstored(request.messages, set(stored))
    return request.override(
        system_message=request.system_message if system is None else system,
        messages=cast("list[AnyMessage]", [*messages, *extra]),
    )
