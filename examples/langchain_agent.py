"""A LangChain agent whose memory is a ctxsum conversation (``CtxsumMiddleware``).

Run it from the checkout's root, after ``pip install -e '.[langchain]' langchain-openai``::

    python examples/langchain_agent.py

It uses the example project's settings (``project.settings``) and database
(``DATABASE_URL``, else ``db.sqlite3``), migrates it, and talks to:

- with ``OPENAI_API_KEY`` (or ``OPENAI_BASE_URL``) set: that OpenAI-compatible server,
  model ``CTXSUM_CHAT_MODEL`` (default ``gpt-4o``), and ctxsum summarizes with it too;
- else: the project's offline stand-in model at
  ``http://127.0.0.1:8000/offline-model/v1`` (start it with ``make run``; it answers
  with what it was sent, and calls no tool), and ctxsum's offline summarizer.

The conversation compacts once its context reaches ``CTXSUM_TRIGGER_TOKENS`` (500 here),
in this process, right after the append that reaches it. Each turn passes only the new
user message: the agent's state grows in its checkpointer, and the middleware sends the
model the conversation's context (system prompt, summary, newest messages) instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the example project's package, beside ctxsum
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

# Compact in this process: the project's own runner queues the compaction for the task
# worker that `make run` starts beside the web server.
os.environ.setdefault("CTXSUM_COMPACTION_RUNNER", "sync")

import django  # noqa: E402

django.setup()

import openai  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.messages import HumanMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

from ctxsum.integrations.langchain import CtxsumMiddleware  # noqa: E402
from ctxsum.models import Conversation  # noqa: E402
from ctxsum.selectors import context_get, conversation_stats  # noqa: E402
from ctxsum.services import conversation_create  # noqa: E402

SYSTEM = (
    "You are a travel assistant. Answer in two or three sentences. Use the convert tool "
    "for any currency conversion."
)
TRIGGER_TOKENS = int(os.environ.get("CTXSUM_TRIGGER_TOKENS", "500"))
TURNS = [
    "Hi! I am planning a week in Lisbon from June 13 to June 20, landing late in the "
    "evening on a flight from Berlin. I would like a quiet neighbourhood near a tram line.",
    "My budget for the hotel is 120 euros a night. How much is that in US dollars?",
    "I don't eat meat, and I would like one dinner with fado music. Do I need to book "
    "restaurants ahead in June, and which area would you pick for that evening?",
    "I would also like a day trip on June 17: Sintra or Cascais? I prefer walking and "
    "palaces to beaches, and I don't want to rent a car.",
    "For the trip back on June 20 my flight leaves at 07:40, so I need an early taxi. "
    "How long does it take to reach the airport, and what should it cost?",
    "Thanks! Can you sum up my plan: dates, budget, food, the day trip and the airport?",
]
RATES_FROM_EUR = {"USD": 1.08, "GBP": 0.85, "EUR": 1.0}


@tool
def convert(amount: float, currency: str) -> str:
    """Convert an amount in euros to ``currency`` (USD, GBP or EUR)."""
    rate = RATES_FROM_EUR.get(currency.upper())
    if rate is None:
        return f"Unknown currency {currency!r}: USD, GBP or EUR."
    return f"{amount:.2f} EUR is {amount * rate:.2f} {currency.upper()}."


def chat_model() -> ChatOpenAI:
    """The agent's model, as the project's chat turn has it: the configured
    OpenAI-compatible server (the openai client reads OPENAI_API_KEY and OPENAI_BASE_URL),
    else the project's offline stand-in (its CHAT_OPTIONS)."""
    model = settings.CTXSUM["DEFAULT_MODEL"]
    if settings.OFFLINE_CHAT_MODEL:
        return ChatOpenAI(model=model, **settings.CTXSUM["CHAT_OPTIONS"])
    return ChatOpenAI(model=model)


def start() -> Conversation:
    call_command("migrate", verbosity=0)
    user, _ = get_user_model().objects.get_or_create(username="demo")
    return conversation_create(
        owner=user,
        title="LangChain agent",
        system=SYSTEM,
        trigger={"tokens": TRIGGER_TOKENS},
        keep={"messages": 4},
    )


def report(conversation: Conversation, state: dict[str, Any]) -> None:
    """The context's size against the transcript's and the agent's state, and whether a
    compaction happened."""
    conversation.refresh_from_db()
    context = context_get(conversation=conversation)
    stats = conversation_stats(conversation=conversation, context=context)
    print(f"\nconversation {conversation.pk}")
    print(f"context: {len(context.messages)} messages, {context.token_count} tokens")
    archived = stats["archived_message_count"]
    print(f"transcript: {stats['message_count']} messages ({archived} archived)")
    print(f"agent state: {len(state['messages'])} messages")
    compactions = stats["compaction_count"]
    print(f"compacted: {'yes' if compactions else 'no'} (compactions: {compactions})")


def unreachable(error: openai.APIConnectionError) -> int:
    print(f"Could not reach the model: {error}", file=sys.stderr)
    if settings.OFFLINE_CHAT_MODEL:
        where = settings.CTXSUM["CHAT_OPTIONS"]["base_url"]
        print(f"Start the offline model first (make run): {where}", file=sys.stderr)
    return 1


def main() -> int:
    conversation = start()
    agent: Any = create_agent(
        chat_model(),
        tools=[convert],
        middleware=[CtxsumMiddleware(conversation)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": str(conversation.pk)}}
    state: dict[str, Any] = {"messages": []}
    for number, text in enumerate(TURNS, start=1):
        print(f"\n[{number}] you: {text}")
        try:
            state = agent.invoke({"messages": [HumanMessage(text)]}, config)
        except openai.APIConnectionError as error:
            return unreachable(error)
        print(f"    agent: {state['messages'][-1].text}")
    report(conversation, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
