"""LangChain's side: a fake chat model that writes the fixed-size summary, message
conversion with stable ids, and a tiktoken token counter for the middleware."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from bench.fixed_summary import FIXED_SUMMARY
from ctxsum import tokens


class FixedSummaryChatModel(BaseChatModel):
    """Answers every call with ``FIXED_SUMMARY`` and records the messages it was sent (in
    OpenAI format), so their tokens can be billed."""

    received: list[list[dict[str, Any]]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "fixed-summary-fake"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.received.append(convert_to_openai_messages(messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=FIXED_SUMMARY))])


def summary_call_tokens(sent: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """Input and output tokens of one summary call of the fake model."""
    return openai_tokens(sent), tokens.count_text(FIXED_SUMMARY)


def openai_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Tokens of a chat request made of these OpenAI-format messages (ctxsum.tokens)."""
    return tokens.context_tokens(tokens.count_message(message) for message in messages)


def tiktoken_counter(messages: Iterable[Any]) -> int:
    """A token_counter for SummarizationMiddleware that counts with tiktoken (o200k_base,
    through ctxsum.tokens) instead of its default character-based estimate."""
    return openai_tokens(convert_to_openai_messages(list(messages)))


def to_langchain(messages: Sequence[Mapping[str, Any]], *, first_index: int = 0) -> list[Any]:
    """LangChain messages for OpenAI-format ``messages``, each with the id ``m<index>`` (its
    index in the recorded conversation), so the benchmark can tell which originals a state
    still holds."""
    converted = convert_to_messages([dict(message) for message in messages])
    for offset, message in enumerate(converted):
        message.id = f"m{first_index + offset}"
    return converted
