"""The example project's chat page in headless Chromium: a reply streamed from a local
OpenAI-compatible server appears piece by piece and is stored; the active context beside it
shows the system prompt, the summary (marked) and the recent messages; nothing is loaded
from outside 127.0.0.1. It saves docs/images/chat.png with SCREENSHOTS_DIR=docs/images."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.urls import reverse

from ctxsum import selectors, services
from tests.support.browser import (
    WAIT_SECONDS,
    chromium,
    local_url,
    log_in,
    needs_chromium,
)

pytestmark = pytest.mark.django_db(transaction=True)

SUMMARY = "Ana flies Zurich to Lisbon on 13 June (NW7Q2K); Casa do Rio holds her room."
REPLY = "Lisbon in June is warm: pack light clothes and a jacket for the evenings."
HISTORY = [
    {"role": "user", "content": "I fly to Lisbon on 13 June, booking NW7Q2K."},
    {"role": "assistant", "content": "Noted: NW7Q2K, Zurich to Lisbon on 13 June."},
    {"role": "user", "content": "The hotel is Casa do Rio, check-in at 22:00."},
    {"role": "assistant", "content": "Casa do Rio holds the room until 02:00."},
    {"role": "user", "content": "I also need a taxi from the airport."},
    {"role": "assistant", "content": "A taxi takes about 25 minutes to the centre."},
]


@pytest.fixture
def browser():
    with chromium(width=1280, height=900) as driver:
        yield driver


def _wait(driver, condition, message: str):
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(driver, WAIT_SECONDS).until(condition, message)


@needs_chromium
def test_the_chat_page_streams_a_reply_beside_the_active_context(
    browser, live_server, django_user_model, chat_model, tmp_path
):
    from selenium.webdriver.common.by import By

    # One local server answers both: the summarizer first, then the chat model.
    chat_model.reply = SUMMARY
    chat_model.stream_pieces = 6
    user = django_user_model.objects.create_user("ana", password="pw-ana", is_staff=True)
    conversation = services.conversation_create(
        owner=user,
        title="Lisbon trip",
        system="You are a travel assistant.",
        messages=HISTORY,
        keep={"messages": 2},
    )
    assert services.conversation_compact(conversation=conversation, force=True).compacted
    chat_model.reply = REPLY
    base = local_url(live_server)
    log_in(browser, base, "ana", "pw-ana")

    browser.get(base + reverse("chat") + f"?c={conversation.pk}")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#context li.summary"), "context")
    context = browser.find_elements(By.CSS_SELECTOR, "#context li")
    assert "You are a travel assistant." in context[0].text
    assert "summary v1" in context[1].text and "summary" in context[1].get_attribute("class")
    assert SUMMARY in context[1].text
    assert "25 minutes" in context[-1].text

    browser.find_element(By.ID, "text").send_keys("What should I pack?")
    browser.find_element(By.ID, "go").click()
    _wait(browser, lambda d: "Stored." in d.find_element(By.ID, "status").text, "stored")

    replies = browser.find_elements(By.CSS_SELECTOR, "#log .message.assistant .body")
    assert replies[-1].text == REPLY
    stored = [row.as_openai() for row in selectors.transcript_list(conversation=conversation)]
    assert stored[-2:] == [
        {"role": "user", "content": "What should I pack?"},
        {"role": "assistant", "content": REPLY},
    ]
    # The request went out streaming; the page showed what the stream carried.
    chat_requests = [body for body in chat_model.bodies if body.get("stream")]
    assert chat_requests and chat_requests[-1]["messages"][-1]["content"] == "What should I pack?"
    _wait(browser, lambda d: REPLY in d.find_element(By.ID, "context").text, "context refresh")

    folder = Path(os.environ.get("SCREENSHOTS_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(folder / "chat.png"))
    assert (folder / "chat.png").read_bytes().startswith(b"\x89PNG")


def test_the_chat_page_needs_a_login(client):
    response = client.get(reverse("chat"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("rest_framework:login"))
