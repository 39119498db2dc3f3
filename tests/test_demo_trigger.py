"""The example project's demo trigger (``CTXSUM_TRIGGER_TOKENS``, project/settings.py): an
ordinary chat, short user turns answered by the project's stand-in model through the chat
endpoint, compacts within 20 turns, and not within the first ten. The compaction is the
background one that follows a turn (the tasks runner, on the immediate backend here, as the
task worker of ``make run`` would run it a moment later), not one before a model call."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings as django_settings

from ctxsum import services
from project.settings import DEMO_TRIGGER_TOKENS
from tests.factories import OFFLINE_SUMMARIZER
from tests.settings import TASKS_MODULE
from tests.support.urls import api_url

needs_stand_in_model = pytest.mark.skipif(
    not django_settings.OFFLINE_CHAT_MODEL,
    reason="OPENAI_API_KEY or OPENAI_BASE_URL is set: the example project uses that server",
)

# The demo runs with ctxsum's defaults: a compaction is made only when it pays.
pytestmark = pytest.mark.ctxsum_defaults

IMMEDIATE = {"default": {"BACKEND": f"{TASKS_MODULE}.backends.immediate.ImmediateBackend"}}
# What someone trying the chat page might type: short questions and remarks.
USER_TURNS = [
    "Hi! I'm planning a trip to Lisbon in June.",
    "I land on the 13th, late in the evening.",
    "Which neighbourhood is nice to stay in?",
    "Something quiet, but near a tram line.",
    "My budget is about 120 euros a night.",
    "Is Alfama too hilly with a suitcase?",
    "OK, what about Estrela?",
    "Do I need to book restaurants ahead?",
    "I don't eat meat, by the way.",
    "What's a good day trip from the city?",
    "How long is the train to Sintra?",
    "Can I buy tickets at the station?",
    "Is the beach at Cascais worth it?",
    "What should I pack for the evenings?",
    "Do shops take cards everywhere?",
    "Any tips for the airport taxi?",
    "How much should I tip in cafés?",
    "What is the best viewpoint at sunset?",
    "Is the old tram 28 worth the queue?",
    "Thanks, can you sum up my plan?",
]


@pytest.fixture
def demo_chat(live_server, settings):
    """The example project's settings with its demo trigger, whatever the environment says:
    the stand-in chat model on the live server, the offline summarizer, compaction after a
    turn run by the tasks runner on the immediate backend."""
    settings.CTXSUM = {
        **settings.CTXSUM,
        "TRIGGER": {"tokens": DEMO_TRIGGER_TOKENS},
        "SUMMARIZER": OFFLINE_SUMMARIZER,
        "AUTO_COMPACT": True,
        "COMPACTION_RUNNER": "tasks",
        "CHAT_OPTIONS": {"base_url": f"{live_server.url}/offline-model/v1", "api_key": "x"},
        "CHAT_RETRY_BACKOFF": 0,
    }
    settings.TASKS = IMMEDIATE


@needs_stand_in_model
# The stand-in model answers from the live server's thread: the data must be committed.
@pytest.mark.django_db(transaction=True)
def test_an_ordinary_chat_compacts_within_twenty_turns(api, user, demo_chat):
    # As the chat page's "New conversation" makes it.
    conversation = services.conversation_create(
        owner=user, title="Lisbon", system="You are a helpful assistant. Be concise."
    )
    compacted_at = None
    for turn, content in enumerate(USER_TURNS, start=1):
        body = {"message": {"role": "user", "content": content}}
        response = api.post(api_url("chat", conversation), body, format="json")
        assert response.status_code == 200, response.content
        # Not before the model call: the stored pair is what reaches the trigger.
        assert response.json()["compaction"] is None
        if api.get(api_url("conversation-detail", conversation)).json()["summary"]:
            compacted_at = turn
            break

    assert compacted_at is not None, "no compaction in 20 turns"
    assert compacted_at > 10, f"compacted after {compacted_at} turns: too soon for a chat"
    context = api.get(api_url("context", conversation)).json()
    assert context["summary"]["version"] == 1
    assert context["token_count"] < DEMO_TRIGGER_TOKENS
    # The next turn's model is sent the summary in place of the older messages.
    body = {"message": {"role": "user", "content": "And the weather?"}}
    reply = api.post(api_url("chat", conversation), body, format="json").json()
    assert "a summary of the older ones" in reply["messages"][-1]["content"]


@pytest.mark.parametrize(
    ("value", "trigger"),
    [(None, {"tokens": DEMO_TRIGGER_TOKENS}), ("3000", {"tokens": 3000})],
)
def test_the_example_projects_trigger_is_read_from_ctxsum_trigger_tokens(value, trigger):
    environment = {k: v for k, v in os.environ.items() if k != "CTXSUM_TRIGGER_TOKENS"}
    if value is not None:
        environment["CTXSUM_TRIGGER_TOKENS"] = value
    code = "import json, project.settings as s; print(json.dumps(s.CTXSUM['TRIGGER']))"
    read = subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        cwd=django_settings.BASE_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(read.stdout) == trigger
