"""The example project's stand-in chat model (project/offline_model.py): with no
OpenAI-compatible server configured, a chat turn goes through the real openai client to the
project's own endpoint, plain or streamed, and the reply says what the model was sent."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings

from ctxsum import services
from tests.factories import turns
from tests.support.urls import api_url

pytestmark = [
    pytest.mark.skipif(
        not django_settings.OFFLINE_CHAT_MODEL,
        reason="OPENAI_API_KEY or OPENAI_BASE_URL is set: the example project uses that server",
    ),
    # The live server answers from another thread: the test database must be committed.
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def offline_chat(live_server, settings, offline_summarizer):
    settings.CTXSUM = {
        **settings.CTXSUM,
        "CHAT_OPTIONS": {"base_url": f"{live_server.url}/offline-model/v1", "api_key": "x"},
        "CHAT_RETRY_BACKOFF": 0,
    }


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_with_the_stand_in_model(api, user, offline_chat, stream):
    conversation = services.conversation_create(
        owner=user, system="Be brief.", messages=turns(8), keep={"messages": 2}
    )
    assert services.conversation_compact(conversation=conversation, force=True).compacted
    body = {"message": {"role": "user", "content": "Where  am   I?"}, "stream": stream}

    response = api.post(api_url("chat", conversation), body, format="json")

    assert response.status_code == 200
    if stream:
        text = b"".join(response.streaming_content).decode()
        assert text.count("data: {") > 5 and "event: ctxsum" in text  # piece by piece
    reply = conversation.messages.order_by("-seq").first().content
    # The system prompt, the summary, the 2 kept messages and the new one.
    assert reply.startswith('You said: "Where am I?". I was sent 5 messages, a summary of')
    assert "OPENAI_API_KEY" in reply


def test_a_request_that_is_not_a_chat_completion_is_a_400(client):
    response = client.post(
        "/offline-model/v1/chat/completions", "{", content_type="application/json"
    )
    assert response.status_code == 400
