"""Key facts in the admin, in a real browser (headless Chromium on a live server): the
conversation's review page shows its facts, a hostile value runs no script, a source link
lands on its message, and the fact list's pin action pins through the service."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from ctxsum.facts.block import facts_recount
from ctxsum.facts.lines import fact_tokens
from ctxsum.facts.models import Fact
from ctxsum.facts.services import fact_add
from ctxsum.models import Conversation, Summary
from tests.factories import compacted_conversation, turns
from tests.support.browser import WAIT_SECONDS, chromium, local_url, log_in, needs_chromium

pytestmark = [needs_chromium, pytest.mark.django_db(transaction=True)]

SCRIPT = "<script>window.pwned = true</script><img src=x onerror='window.pwned = true'>"


@pytest.fixture
def browser():
    with chromium(width=1280) as driver:
        yield driver


def conversation_with_facts(owner) -> Conversation:
    conversation = compacted_conversation(
        owner,
        subject="customer-42",
        messages=turns(60, "turn {i}: booking NW7Q2K, seat {i}A"),
        keep={"messages": 2},
    )
    # Only the facts below: not the ones the offline summarizer extracted as it compacted.
    Fact.objects.filter(owner=owner).delete()
    summary = Summary.objects.get(conversation=conversation)
    Fact.objects.create(
        owner=owner,
        conversation=conversation,
        key="booking",
        value=f"NW7Q2K {SCRIPT}",
        summary=summary,
        source_conversation=conversation,
        source_seqs=[55],  # on the transcript's second page
        token_count=fact_tokens("booking", "NW7Q2K"),
        confirmed_at=timezone.now(),
    )
    facts_recount([conversation])
    fact_add(user=owner, subject="customer-42", key="name", value="Maria")
    return conversation


def test_facts_on_the_review_page_and_the_pin_action(
    browser, live_server, django_user_model, offline_summarizer, tmp_path: Path
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.wait import WebDriverWait

    wait = WebDriverWait(browser, WAIT_SECONDS)

    admin = django_user_model.objects.create_superuser("reviewer", password="pw-reviewer")
    conversation = conversation_with_facts(admin)
    base = local_url(live_server)
    log_in(browser, base, "reviewer", "pw-reviewer")

    browser.get(base + reverse("admin:ctxsum_conversation_review", args=[conversation.pk]))
    rows = browser.find_elements(By.CSS_SELECTOR, "table.ctxsum-keyfacts tbody tr")
    assert len(rows) == 2 and rows[0].is_displayed()
    assert SCRIPT in browser.find_element(By.ID, f"fact-{Fact.objects.get(key='booking').pk}").text
    assert browser.execute_script("return window.pwned === undefined")
    browser.save_screenshot(str(tmp_path / "facts.png"))

    browser.find_element(By.CSS_SELECTOR, "table.ctxsum-keyfacts a[href*='#m55']").click()
    wait.until(expected_conditions.url_contains("?page=2#m55"))
    assert wait.until(expected_conditions.visibility_of_element_located((By.ID, "m55")))

    browser.get(base + reverse("admin:ctxsum_facts_fact_changelist"))
    name = Fact.objects.get(key="name")
    checkbox = f"input[name='_selected_action'][value='{name.pk}']"
    browser.find_element(By.CSS_SELECTOR, checkbox).click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("pin")
    browser.find_element(By.CSS_SELECTOR, "button[name='index']").click()
    said = wait.until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist"))
    )
    assert "1 fact pinned." in said.text
    name.refresh_from_db()
    assert name.pinned and name.changed_by_user == admin
