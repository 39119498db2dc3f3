"""A staff user refused an admin page or action (undoing a compaction, redacting a message,
changing or deleting a conversation or a fact) gets the admin's own page, status 403: it
says what was refused and links back, in place of Django's bare "403 Forbidden"."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from ctxsum.models import Summary
from tests.factories import booked_conversation
from tests.support.browser import WAIT_SECONDS, chromium, local_url, log_in, needs_chromium

TEMPLATE = "ctxsum/admin/forbidden.html"
UNDO = "Undoing a compaction needs the permission to change conversations."
REDACT = "Redacting a message needs the permission to change messages."
VIEWING = ("view_conversation", "view_summary", "view_message")


@pytest.fixture(autouse=True)
def offline(offline_summarizer):
    """Compactions summarized offline."""


def staff_with(django_user_model, *codenames: str):
    staff = django_user_model.objects.create_user("staff", password="pw-staff", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return staff


def refused(response, reason: str) -> str:
    """The refusal page's HTML, after checking its status, its template and its text."""
    assert response.status_code == 403
    assert TEMPLATE in [template.name for template in response.templates]
    html = response.content.decode()
    assert reason in html and 'id="header"' in html
    return html


@pytest.mark.django_db
def test_a_refused_review_action_answers_403_on_the_admin_page(django_user_model, user):
    conversation = booked_conversation(user)
    client = Client()
    client.force_login(staff_with(django_user_model, *VIEWING))
    review = reverse("admin:ctxsum_conversation_review", args=[conversation.pk])
    revert = reverse("admin:ctxsum_conversation_revert", args=[conversation.pk, 1])
    redact = reverse("admin:ctxsum_conversation_redact", args=[conversation.pk, 4])

    for response in (client.get(revert), client.post(revert)):
        assert f'href="{review}"' in refused(response, UNDO)  # back to the conversation
    assert Summary.objects.get(conversation=conversation, version=1).active
    for response in (client.get(redact), client.post(redact)):
        refused(response, REDACT)
    # Django's own change page, posted without the change permission.
    change = reverse("admin:ctxsum_conversation_change", args=[conversation.pk])
    refused(client.post(change, {"title": "x"}), "You may not change conversations.")
    refused(client.get(change.replace("change", "delete")), "You may not delete conversations.")


@pytest.mark.django_db
def test_without_the_view_permission_the_way_back_is_the_admin_home(django_user_model, user):
    conversation = booked_conversation(user)
    client = Client()
    client.force_login(staff_with(django_user_model, "view_message"))
    review = reverse("admin:ctxsum_conversation_review", args=[conversation.pk])
    html = refused(client.get(review), "You may not view conversations.")
    assert f'href="{reverse("admin:index")}" class="button"' in html


@pytest.mark.django_db
def test_a_refused_fact_delete_answers_on_the_admin_page(django_user_model, user):
    from ctxsum.facts.models import Fact
    from ctxsum.facts.services import fact_add

    conversation = booked_conversation(user)
    fact = fact_add(user=user, conversation=conversation, key="seat", value="14A")
    client = Client()
    client.force_login(staff_with(django_user_model, "view_fact"))
    delete = reverse("admin:ctxsum_facts_fact_delete", args=[fact.pk])
    refused(client.post(delete, {"post": "yes"}), "You may not delete facts.")
    assert Fact.objects.filter(pk=fact.pk).exists()


@needs_chromium
@pytest.mark.django_db(transaction=True)
def test_the_refusal_page_in_chromium_is_the_admins_own(live_server, django_user_model, user):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    conversation = booked_conversation(user)
    staff_with(django_user_model, *VIEWING)
    revert = reverse("admin:ctxsum_conversation_revert", args=[conversation.pk, 1])
    review = reverse("admin:ctxsum_conversation_review", args=[conversation.pk])
    with chromium(width=1280, height=900) as browser:
        base = local_url(live_server)
        log_in(browser, base, "staff", "pw-staff")
        browser.get(base + revert)

        header = browser.find_element(By.ID, "header")
        assert header.is_displayed() and "Django administration" in header.text
        assert "Permission denied" in browser.title
        assert browser.find_element(By.CSS_SELECTOR, ".errornote").text == UNDO
        # The admin's stylesheet applies: its header is coloured, not the browser's default.
        background = header.value_of_css_property("background-color")
        assert background not in ("rgba(0, 0, 0, 0)", "transparent"), background
        assert browser.find_element(By.ID, "logout-form").is_displayed()

        browser.find_element(By.ID, "back").click()
        WebDriverWait(browser, WAIT_SECONDS).until(expected_conditions.url_contains(review))
        assert browser.find_element(By.CSS_SELECTOR, "#content h1").text == "Review conversation"
