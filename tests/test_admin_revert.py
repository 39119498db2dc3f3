"""Undoing a compaction from the admin and the command line: the summary page of the active
version links a confirmation page that reverts through the service (CSRF and the change
permission required), the conversation list's action undoes the last compaction of each
selected conversation, the summary list and pages show the reverted versions, and
``manage.py ctxsum_revert`` does the same for conversations named or all."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from ctxsum.admin.actions import ACTION_LIMIT
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.selectors import context_get
from ctxsum.services import conversation_create, message_append
from tests.factories import (
    OFFLINE_SUMMARIZER,
    assistant_calls,
    assistant_message,
    compact,
    long_user_message,
    system_message,
    tool_result,
    user_message,
)
from tests.invariants import assert_context_invariants

pytestmark = pytest.mark.django_db

HISTORY = [
    system_message("You are a travel assistant."),
    long_user_message("A"),
    assistant_message("Noted."),
    assistant_calls("call_delhi", name="get_weather"),
    tool_result("call_delhi", "20 C"),
    long_user_message("B"),
    assistant_message("Done."),
    user_message("Thanks."),
]


@pytest.fixture(autouse=True)
def offline(settings):
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}


def url(name: str, *args) -> str:
    return reverse(f"admin:ctxsum_{name}", args=args)


def page(client: Client, address: str, status: int = 200) -> str:
    response = client.get(address)
    assert response.status_code == status, response.content[:2000]
    return response.content.decode()


def compacted(owner, **fields) -> Conversation:
    conversation = conversation_create(
        owner=owner, messages=HISTORY, keep={"messages": 2}, **fields
    )
    compact(conversation)
    return conversation


def act(client: Client, action: str, conversations) -> list[str]:
    response = client.post(
        url("conversation_changelist"),
        {"action": action, "_selected_action": [str(c.pk) for c in conversations]},
        follow=True,
    )
    assert response.status_code == 200
    return [str(message) for message in response.context["messages"]]


def test_the_active_summary_page_asks_first_then_undoes_the_compaction(admin_client, user):
    conversation = conversation_create(owner=user, messages=HISTORY, keep={"messages": 2})
    before = context_get(conversation=conversation).messages
    compact(conversation)
    summary = Summary.objects.get(conversation=conversation, active=True)
    archived = Message.objects.filter(summary=summary).count()
    address = url("conversation_revert", conversation.pk, summary.version)
    assert address in page(admin_client, url("summary_change", summary.pk))

    confirm = page(admin_client, address)
    assert "csrfmiddlewaretoken" in confirm and 'method="post"' in confirm
    assert f"the {archived} messages it archived" in confirm
    assert "The conversation will have no summary." in confirm
    assert Summary.objects.get(pk=summary.pk).active  # asking changed nothing

    response = admin_client.post(address, follow=True)

    assert response.redirect_chain[0] == (url("conversation_review", conversation.pk), 302)
    said = [str(message) for message in response.context["messages"]]
    assert said == [
        f"v1 was reverted: {archived} messages are active again, and the conversation has "
        "no summary."
    ]
    assert context_get(conversation=conversation).messages == before
    assert_context_invariants(conversation, original_messages=HISTORY)
    summary_page = page(admin_client, url("summary_change", summary.pk))
    assert 'ctxsum-badge ctxsum-reverted">reverted' in summary_page
    assert address not in summary_page  # only the active version offers it
    assert "was reverted already" in page(admin_client, address)
    listing = url("summary_changelist")
    assert url("summary_change", summary.pk) in page(admin_client, f"{listing}?reverted__exact=1")
    assert url("summary_change", summary.pk) not in page(
        admin_client, f"{listing}?reverted__exact=0"
    )
    review = page(admin_client, url("conversation_review", conversation.pk))
    # The version's badge, and the attempt's.
    assert 'ctxsum-reverted">reverted' in review and review.count("ctxsum-reverted") == 2


def test_an_older_version_offers_no_undo_and_a_post_for_it_changes_nothing(admin_client, user):
    conversation = compacted(user)
    message_append(
        conversation=conversation, messages=[long_user_message(f"m{i}") for i in range(4)]
    )
    compact(conversation)
    first, second = Summary.objects.filter(conversation=conversation).order_by("version")
    older = url("conversation_revert", conversation.pk, 1)
    assert older not in page(admin_client, url("summary_change", first.pk))
    assert url("conversation_revert", conversation.pk, 2) in page(
        admin_client, url("summary_change", second.pk)
    )
    assert "Yes, undo it" not in page(admin_client, older)

    response = admin_client.post(older, follow=True)

    said = [str(message) for message in response.context["messages"]]
    assert said == [
        "Version 1 is not the active summary (the active one is v2); only the active "
        "summary can be reverted."
    ]
    assert Summary.objects.get(pk=second.pk).active
    assert page(admin_client, url("conversation_revert", conversation.pk, 9), 404)


def test_undo_needs_the_csrf_token_and_the_change_permission(django_user_model, user):
    conversation = compacted(user)
    staff = django_user_model.objects.create_user("csrf", password="pw", is_staff=True)
    staff.user_permissions.set(
        Permission.objects.filter(codename__in=["view_conversation", "view_summary"])
    )
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    address = url("conversation_revert", conversation.pk, 1)
    summary = Summary.objects.get(conversation=conversation)
    assert address not in page(client, url("summary_change", summary.pk))
    assert client.get(address).status_code == 403  # no change_conversation permission
    staff.user_permissions.add(Permission.objects.get(codename="change_conversation"))
    assert client.post(address).status_code == 403  # no CSRF token
    html = page(client, address)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    assert client.post(address, {"csrfmiddlewaretoken": token}).status_code == 302
    assert Summary.objects.get(pk=summary.pk).reverted


def test_the_action_undoes_the_last_compaction_of_each(admin_client, user):
    twice = compacted(user, title="twice")
    message_append(conversation=twice, messages=[long_user_message(f"m{i}") for i in range(4)])
    compact(twice)
    once = compacted(user, title="once")
    plain = conversation_create(owner=user, messages=[user_message("hi")])

    said = act(admin_client, "revert_last", [twice, once, plain])

    assert said == ["2 reverted, 1 had nothing to revert"]
    assert Summary.objects.get(conversation=twice, active=True).version == 1
    assert not Summary.objects.filter(conversation=once, active=True).exists()
    for conversation in (twice, once, plain):
        assert_context_invariants(conversation)
    attempts = CompactionAttempt.objects.filter(outcome="reverted")
    assert sorted(attempts.values_list("summary__version", flat=True)) == [1, 2]
    # The list's last compaction column shows it.
    assert 'ctxsum-badge ctxsum-reverted">Reverted' in page(
        admin_client, url("conversation_changelist")
    )


def test_the_action_is_capped_like_the_others(admin_client, user):
    many = [conversation_create(owner=user, title=f"c{i}") for i in range(ACTION_LIMIT + 1)]
    said = act(admin_client, "revert_last", many)
    assert said == [
        f"Select at most {ACTION_LIMIT} conversations at a time; for more, run "
        "“manage.py ctxsum_revert ID…”."
    ]


def test_the_command_reverts_the_named_conversations_or_all(user):
    first = compacted(user, title="first")
    second = compacted(user, title="second")
    plain = conversation_create(owner=user, messages=[user_message("hi")])

    out = StringIO()
    call_command("ctxsum_revert", str(first.pk), str(plain.pk), stdout=out)
    lines = out.getvalue().splitlines()
    restored = CompactionAttempt.objects.get(conversation=first, outcome="reverted")
    count = restored.to_seq - restored.from_seq + 1
    assert f"{first.pk}: reverted (v1 -> none, {count} messages restored)" in lines
    assert f"{plain.pk}: nothing_to_revert" in lines

    out = StringIO()
    call_command("ctxsum_revert", "--all", stdout=out)
    assert out.getvalue().strip() == "1 conversation(s): reverted 1"  # only second had one
    assert not Summary.objects.filter(active=True).exists()
    assert_context_invariants(second)
    with pytest.raises(CommandError, match="not both"):
        call_command("ctxsum_revert", str(first.pk), "--all")
