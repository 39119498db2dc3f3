"""An OpenAI Agents SDK agent whose memory is a ctxsum conversation: six turns, compacted
on the way, with nothing but ``session=CtxsumSession(conversation)``.

Run it from the checkout, after ``pip install -e '.[agents]'``::

    python examples/openai_agents_session.py

It uses the example project's settings and database (``DATABASE_URL``, else db.sqlite3,
migrated here). The agent's model is OpenAI's (or any compatible server's) when
``OPENAI_API_KEY`` or ``OPENAI_BASE_URL`` is set, else the example project's stand-in model,
served by ``make run`` at ``CTXSUM_OFFLINE_MODEL_URL``. Compactions run in this process
(``CTXSUM_COMPACTION_RUNNER=sync``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("CTXSUM_COMPACTION_RUNNER", "sync")

import django

django.setup()

from agents import Agent, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from ctxsum.integrations.openai_agents import CtxsumSession  # noqa: E402
from ctxsum.selectors import acontext_get  # noqa: E402
from ctxsum.services import conversation_create  # noqa: E402

QUESTIONS = [
    "I'm planning a trip to Lyon next month. What should I see first?",
    "Which trains leave Paris for Lyon in the morning?",
    "Is the old town walkable from Part-Dieu station?",
    "What local dish should I try, and where?",
    "Can you suggest a day trip from Lyon?",
    "Remind me: which train did we pick, and what was the dish?",
]


@function_tool
def timetable(city: str) -> str:
    """The morning trains from Paris to ``city``."""
    return f"Paris to {city}: 07:04, 08:12 and 09:30, about two hours."


def model() -> OpenAIChatCompletionsModel:
    """OpenAI's (or a compatible server's) when configured, else the project's stand-in."""
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        client = AsyncOpenAI()
    else:
        client = AsyncOpenAI(**settings.CTXSUM["CHAT_OPTIONS"])
    return OpenAIChatCompletionsModel(model=settings.CTXSUM["DEFAULT_MODEL"], openai_client=client)


async def main() -> None:
    set_tracing_disabled(True)
    user, _ = await get_user_model().objects.aget_or_create(username="demo")
    conversation = await asyncio.to_thread(
        conversation_create,
        owner=user,
        title="Agents SDK example",
        system="You are a travel assistant. Answer in two sentences.",
        # A small trigger, so that six turns compact.
        trigger={"tokens": 300},
        keep={"messages": 4},
    )
    session = CtxsumSession(conversation)
    agent = Agent(name="travel", model=model(), tools=[timetable])
    for question in QUESTIONS:
        result = await Runner.run(agent, question, session=session)
        print(f"> {question}\n{result.final_output}\n")
    context = await acontext_get(conversation=session.conversation)
    await session.conversation.arefresh_from_db()
    counted = session.conversation
    print(f"conversation {counted.pk}")
    print(f"transcript: {counted.message_count} messages; context: {len(context.messages)}")
    print(f"compacted: {'yes' if counted.compaction_count else 'no'}")


if __name__ == "__main__":
    call_command("migrate", verbosity=0)
    asyncio.run(main())
