"""The admin in a real browser: headless Chromium (Debian's chromium and chromium-driver)
logs in on a live server, opens an imported agent conversation that the offline summarizer
compacted twice, its newest summary, and the stale-summary filter after a prompt change,
and takes a screenshot of each at 1,280 px wide.

The screenshots go to a temporary folder, or, with ``SCREENSHOTS_DIR`` set (``make
screenshots`` sets it to docs/images), where the README and the docs show them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.urls import reverse

from ctxsum.models import Conversation, Summary
from ctxsum.services import conversation_update, file_import
from tests.factories import compact
from tests.support.browser import chromium, local_url, log_in, needs_chromium
from tests.support.shared import FIXTURE_CONVERSATIONS

WIDTH = 1280
MAX_HEIGHT = 2400  # a full page, up to this
# An agent run with parallel tool calls (tests/fixtures/README.md), and others compacted
# once so the lists have several rows.
AGENT = "tau2sub-ironshell-ironforge_ironshell-ui_2026-03-09"
OTHERS = ("taubench-gpt-4o-airline", "tooltalk-data_tooltalk_Calendar", "star-4965")

pytestmark = [needs_chromium, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium(width=WIDTH) as driver:
        yield driver


@pytest.fixture
def screenshots(tmp_path) -> Path:
    folder = Path(os.environ.get("SCREENSHOTS_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _imported(prefix: str) -> Conversation:
    return Conversation.objects.get(metadata__source_id__startswith=prefix)


def _agent_conversation(owner, settings) -> Conversation:
    """The conversations of the fixtures imported; the agent run compacted twice (forced),
    so its newest summary has a previous version to differ from, a few others once."""
    settings.CTXSUM = {"SUMMARIZER": "ctxsum.summarizers.offline.OfflineSummarizer"}
    tally = file_import(FIXTURE_CONVERSATIONS, owner=owner, seen=set())
    assert tally.conversations == 12, tally.reasons
    for prefix in OTHERS:
        compact(_imported(prefix))
    conversation = _imported(AGENT)
    conversation_update(conversation=conversation, keep={"messages": 12})
    compact(conversation)
    conversation_update(conversation=conversation, keep={"messages": 4})
    compact(conversation)
    return conversation


def _shoot(driver, path: Path) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, min(max(height, 900), MAX_HEIGHT))
    driver.save_screenshot(str(path))
    driver.set_window_size(WIDTH, 900)




def test_screenshots_of_the_review_pages(
    browser, live_server, django_user_model, settings, screenshots, tmp_path
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    admin = django_user_model.objects.create_superuser("reviewer", password="pw-reviewer")
    conversation = _agent_conversation(admin, settings)
    summary = Summary.objects.get(conversation=conversation, active=True)
    base = local_url(live_server)
    log_in(browser, base, "reviewer", "pw-reviewer")

    review = reverse("admin:ctxsum_conversation_review", args=[conversation.pk])
    browser.get(base + review)
    assert browser.find_element(By.CSS_SELECTOR, ".ctxsum-summary-msg").is_displayed()
    assert browser.find_elements(By.CSS_SELECTOR, ".ctxsum-call pre.ctxsum-json")
    _shoot(browser, screenshots / "admin-conversation.png")

    browser.get(base + reverse("admin:ctxsum_summary_change", args=[summary.pk]))
    assert browser.find_elements(By.CSS_SELECTOR, ".ctxsum-diff ins, .ctxsum-diff del")
    assert browser.find_elements(By.CSS_SELECTOR, ".ctxsum-newly")
    _shoot(browser, screenshots / "admin-summary.png")

    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    browser.get(base + reverse("admin:ctxsum_conversation_changelist") + "?stale=yes")
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1 + len(OTHERS)  # every active summary: prompt version 1
    browser.find_element(By.ID, "action-toggle").click()  # select them all
    Select(browser.find_element(By.NAME, "action")).select_by_value("rebuild_stale")
    _shoot(browser, screenshots / "admin-stale.png")

    browser.get(base + reverse("admin:ctxsum_summary_changelist") + "?stale=yes")
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 2 + len(OTHERS)  # superseded or not, all under version 1
    assert browser.find_elements(By.CSS_SELECTOR, ".ctxsum-badge.ctxsum-stale")
    _shoot(browser, tmp_path / "summaries-stale.png")

    for name in ("admin-conversation.png", "admin-summary.png", "admin-stale.png"):
        assert (screenshots / name).read_bytes().startswith(b"\x89PNG")
