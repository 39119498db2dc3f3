"""A conversation's review page in headless Chromium at the widths reviewers use: the
summary versions and the compaction attempts sit side by side or one under the other, never
one over the other, and neither cuts off a column."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ctxsum.services import conversation_update, message_append
from tests.factories import compact, conversation_with_turns, turns
from tests.support.browser import chromium, local_url, log_in, needs_chromium

pytestmark = [needs_chromium, pytest.mark.django_db(transaction=True)]

# The two tables' boxes, their containers' and every cell's right edge, read in one call.
BOXES = """
const box = (e) => { const r = e.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
return [...document.querySelectorAll("#content-main h2")]
  .filter((h) => ["Summary versions", "Compaction attempts"].includes(h.textContent.trim()))
  .map((h) => { const table = h.parentElement.querySelector("table");
    return {title: h.textContent.trim(), table: box(table), holder: box(h.parentElement),
            scrolls: table.parentElement.scrollWidth > table.parentElement.clientWidth + 1,
            cells: [...table.querySelectorAll("th, td")].map(box)}; });
"""


def _overlap(a: dict, b: dict) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and b["top"] < a["bottom"]
    )


@pytest.mark.parametrize("width,height", [(1400, 900), (1920, 1080)])
def test_the_summary_versions_and_the_attempts_never_overlap(
    live_server, django_user_model, width, height
):
    admin = django_user_model.objects.create_superuser("reviewer", password="pw-reviewer")
    conversation = conversation_with_turns(admin, 40, title="A long trip")
    # Several versions (active, superseded) and several attempts, forced and not.
    for keep in (30, 20, 10):
        conversation_update(conversation=conversation, keep={"messages": keep})
        compact(conversation)
    message_append(conversation=conversation, messages=turns(4, "more {i}"))
    compact(conversation)

    with chromium(width=width, height=height) as browser:
        base = local_url(live_server)
        log_in(browser, base, "reviewer", "pw-reviewer")
        browser.get(base + reverse("admin:ctxsum_conversation_review", args=[conversation.pk]))
        viewport = browser.execute_script("return document.documentElement.clientWidth;")
        versions, attempts = browser.execute_script(BOXES)

    assert versions["title"] == "Summary versions" and attempts["title"] == "Compaction attempts"
    assert not _overlap(versions["table"], attempts["table"]), (versions, attempts)
    for table in (versions, attempts):
        # The whole table inside its column and the window: no column cut off or scrolled away.
        assert table["table"]["left"] >= table["holder"]["left"] - 1, table
        assert table["table"]["right"] <= table["holder"]["right"] + 1, table
        assert table["table"]["right"] <= viewport, table
        assert not table["scrolls"], table
        assert all(cell["right"] <= table["table"]["right"] + 1 for cell in table["cells"])
