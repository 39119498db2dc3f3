"""The example project's chat page in headless Chromium: a reply streamed from a local
OpenAI-compatible server appears piece by piece and is stored; the active context beside it
shows the system prompt, the summary (marked) and the recent messages, and follows a
compaction that the task worker lands after a turn, with no reload; the log holds the whole
transcript, its latest page first and older ones as it is scrolled up; the conversation
list counts a turn's messages with no reload; nothing is loaded from outside 127.0.0.1. It
saves docs/images/chat.png with SCREENSHOTS_DIR=docs/images."""

from __future__ import annotations

import os
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from ctxsum import selectors, services
from ctxsum.tokens import count_message
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


@pytest.fixture
def task_worker(chat_model, settings):
    """AUTO_COMPACT on with the tasks runner on the example project's task backend
    (django-tasks-db): a turn's compaction task waits in the database until the test runs
    ``manage.py db_worker --batch``, as ``make run``'s worker runs it a moment later."""
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "tasks"}
    settings.TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

    def run() -> None:
        call_command("db_worker", "--batch", "--no-startup-delay", "--no-reload", stdout=StringIO())

    return run


@needs_chromium
def test_the_context_panel_shows_a_compaction_the_worker_lands_after_the_reply(
    browser, live_server, django_user_model, chat_model, task_worker
):
    from django_tasks_db.models import DBTaskResult
    from selenium.webdriver.common.by import By

    chat_model.reply = REPLY
    user = django_user_model.objects.create_user("ana", password="pw-ana", is_staff=True)
    conversation = services.conversation_create(
        owner=user, title="Lisbon trip", system="You are a travel assistant.", messages=HISTORY
    )
    # A trigger the question alone stays under and the question with its reply reaches:
    # the turn queues a compaction once it is stored, none runs before the model call.
    question = {"role": "user", "content": "What should I pack?"}
    stored = selectors.context_get(conversation=conversation).token_count
    room = count_message(question, model=conversation.model or "gpt-4o") + 5
    services.conversation_update(
        conversation=conversation, trigger={"tokens": stored + room}, keep={"messages": 2}
    )
    base = local_url(live_server)
    log_in(browser, base, "ana", "pw-ana")
    browser.get(base + reverse("chat") + f"?c={conversation.pk}")
    _wait(browser, lambda d: "25 minutes" in d.find_element(By.ID, "context").text, "context")
    browser.execute_script("window.sameDocument = true;")

    browser.find_element(By.ID, "text").send_keys(question["content"])
    browser.find_element(By.ID, "go").click()
    _wait(browser, lambda d: "Stored." in d.find_element(By.ID, "status").text, "stored")
    _wait(browser, lambda d: "queued" in d.find_element(By.ID, "background").text, "queued")
    assert "compacted first" not in browser.find_element(By.ID, "status").text
    assert not browser.find_elements(By.CSS_SELECTOR, "#context li.summary")

    # The worker runs the queued task after the reply.
    [task] = DBTaskResult.objects.all()
    assert task.status == "READY" and task.task_path == "ctxsum.tasks.compact_conversation"
    chat_model.reply = SUMMARY
    task_worker()
    assert DBTaskResult.objects.get(pk=task.pk).status == "SUCCESSFUL"

    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#context li.summary"), "summary")
    summary = browser.find_element(By.CSS_SELECTOR, "#context li.summary")
    assert "summary v1" in summary.text and SUMMARY in summary.text
    landed = browser.find_element(By.ID, "background").text
    assert "Compacted in the background: summary v1" in landed
    context = browser.find_elements(By.CSS_SELECTOR, "#context li")
    assert REPLY in context[-1].text and "25 minutes" not in context[-1].text
    assert browser.execute_script("return window.sameDocument === true;")


@needs_chromium
def test_the_conversation_list_counts_a_turn_without_a_reload(
    browser, live_server, django_user_model, chat_model
):
    from selenium.webdriver.common.by import By

    chat_model.reply = REPLY
    user = django_user_model.objects.create_user("ana", password="pw-ana", is_staff=True)
    other = services.conversation_create(owner=user, title="Older trip", messages=HISTORY)
    conversation = services.conversation_create(
        owner=user, title="Lisbon trip", system="You are a travel assistant."
    )
    base = local_url(live_server)
    log_in(browser, base, "ana", "pw-ana")
    browser.get(base + reverse("chat") + f"?c={conversation.pk}")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#context li"), "context")
    lisbon, older = str(conversation.pk), str(other.pk)
    assert _entries(browser) == {
        lisbon: "Lisbon trip (1 message)",
        older: "Older trip (6 messages)",
    }
    browser.execute_script("window.sameDocument = true;")

    browser.find_element(By.ID, "text").send_keys("What should I pack?")
    browser.find_element(By.ID, "go").click()
    _wait(browser, lambda d: "Stored." in d.find_element(By.ID, "status").text, "stored")

    # The system prompt, the question and the reply: counted from the turn's stats.
    counted = "Lisbon trip (3 messages)"
    _wait(browser, lambda d: _entries(d)[lisbon] == counted, "the list counting the turn")
    assert selectors.transcript_list(conversation=conversation).count() == 3
    assert _entries(browser)[older] == "Older trip (6 messages)"
    assert browser.execute_script("return window.sameDocument === true;")


def _entries(driver) -> dict[str, str]:
    """The conversation list's entries: each one's text by conversation id."""
    return driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#conversation option')]"
        ".map((o) => [o.value, o.textContent]));"
    )


def _log_bodies(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#log .message .body')].map((e) => e.textContent);"
    )


@needs_chromium
def test_after_a_reload_the_log_holds_the_whole_transcript_older_pages_on_scroll(
    browser, live_server, django_user_model, offline_summarizer
):
    from selenium.webdriver.common.by import By

    user = django_user_model.objects.create_user("ana", password="pw-ana", is_staff=True)
    said = [f"Message {n}: about the Lisbon trip, day {n % 7 + 1}." for n in range(100)]
    conversation = services.conversation_create(
        owner=user,
        title="A long one",
        system="You are a travel assistant.",
        messages=[
            {"role": "user" if n % 2 == 0 else "assistant", "content": text}
            for n, text in enumerate(said)
        ],
        keep={"messages": 4},
    )
    assert services.conversation_compact(conversation=conversation, force=True).compacted
    transcript = [row.as_openai() for row in selectors.transcript_list(conversation=conversation)]
    assert len(transcript) == 101  # four pages of 30 on the page
    base = local_url(live_server)
    log_in(browser, base, "ana", "pw-ana")

    browser.get(base + reverse("chat") + f"?c={conversation.pk}")
    _wait(browser, lambda d: said[-1] in _log_bodies(d), "latest page")
    shown = _log_bodies(browser)
    assert said[0] not in shown and len(shown) < len(transcript)
    assert shown == [message["content"] for message in transcript[-len(shown) :]]
    log = browser.find_element(By.ID, "log")
    below = "const e = arguments[0]; return e.scrollHeight - e.scrollTop - e.clientHeight;"
    assert browser.execute_script(below, log) < 5  # scrolled to the latest message
    # The active messages are shown as they are, the archived ones with their summary.
    assert "in summary v1" not in browser.find_elements(By.CSS_SELECTOR, "#log .message")[-1].text

    # Scrolling to the top brings older pages, in order, until the first message.
    for _ in range(10):
        if transcript[0]["content"] in _log_bodies(browser):
            break
        count = len(_log_bodies(browser))
        browser.execute_script("arguments[0].scrollTop = 0;", log)
        _wait(browser, lambda d, count=count: len(_log_bodies(d)) > count, "older page")
    assert _log_bodies(browser) == [message["content"] for message in transcript]
    assert "The start of the conversation." in browser.find_element(By.ID, "older").text
    first_archived = browser.find_elements(By.CSS_SELECTOR, "#log .message")[1]
    assert "archived" in first_archived.get_attribute("class")
    assert "in summary v1" in first_archived.text


def test_the_chat_page_needs_a_login(client):
    response = client.get(reverse("chat"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("rest_framework:login"))
