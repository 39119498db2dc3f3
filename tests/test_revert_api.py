"""Undoing a compaction over REST: ``POST …/summaries/{version}/revert/``. The context it
answers with is the one before the compaction plus what was appended since; hostile paths
and bodies change nothing."""

from __future__ import annotations

from typing import Any

import pytest

from ctxsum import services
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from tests.factories import booking_history, long_user_message
from tests.invariants import assert_context_invariants
from tests.support.errors import field_codes, field_errors
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

SYSTEM = "You book flights."
POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
NO_SUCH_SUMMARY = {"detail": "No such summary version in this conversation.", "code": "not_found"}


@pytest.fixture
def booking(user, offline_summarizer) -> tuple[Conversation, list[dict[str, Any]]]:
    """The booking chat after a system prompt, not compacted yet, and its messages."""
    history = booking_history()
    conversation = services.conversation_create(
        owner=user, system=SYSTEM, messages=history, **POLICY
    )
    return conversation, [{"role": "system", "content": SYSTEM}, *history]


def state(conversation: Conversation) -> tuple:
    """Everything a refused request must leave as it was."""
    row = Conversation.objects.get(pk=conversation.pk)
    return (
        row.revision,
        row.active_message_count,
        row.active_tokens,
        row.lease_owner,
        list(Message.objects.filter(conversation=row).values_list("seq", "summary")),
        list(Summary.objects.filter(conversation=row).values_list("pk", "active", "reverted")),
        CompactionAttempt.objects.filter(conversation=row).count(),
    )


def revert(api: Any, conversation: Conversation, version: Any, **extra: Any) -> Any:
    return api.post(api_url("summary-revert", conversation, version=version), **extra)


def compact(api: Any, conversation: Conversation) -> dict[str, Any]:
    body = api.post(api_url("compact", conversation), {"force": True}, format="json").json()
    assert body["compacted"], body
    return body


def test_a_revert_answers_the_context_before_the_compaction_plus_what_came_since(api, booking):
    conversation, originals = booking
    before = api.get(api_url("context", conversation)).json()
    compacted = compact(api, conversation)
    archived = compacted["plan"]["archive"]["count"]
    later = long_user_message("later")
    appended = api.post(api_url("message-list", conversation), later, format="json").json()

    response = revert(api, conversation, 1)

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["reverted"], body["reason"], body["reverted_version"]) == (True, "reverted", 1)
    assert (body["messages_restored"], body["summary"]) == (archived, None)
    context = body["context"]
    assert context["messages"] == [*before["messages"], later]
    assert context["token_count"] == before["token_count"] + appended["messages"][0]["token_count"]
    assert context["summary"] is None
    assert context["revision"] == before["revision"] + 3  # compaction, append, revert
    assert context == api.get(api_url("context", conversation)).json()
    listed = api.get(api_url("summary-list", conversation)).json()["results"]
    assert [(s["version"], s["active"], s["reverted"]) for s in listed] == [(1, False, True)]
    transcript = api.get(api_url("message-list", conversation)).json()["results"]
    assert not any(message["archived"] for message in transcript)
    assert_context_invariants(conversation, original_messages=[*originals, later])


def test_reverting_twice_in_a_row_over_rest(api, booking):
    conversation, originals = booking
    first_context = api.get(api_url("context", conversation)).json()["messages"]
    compact(api, conversation)
    more = [long_user_message(f"more {index}") for index in range(4)]
    api.post(api_url("message-list", conversation), {"messages": more}, format="json")
    second_context = api.get(api_url("context", conversation)).json()["messages"]
    compact(api, conversation)

    one = revert(api, conversation, 2).json()
    assert (one["reverted"], one["summary"]["version"], one["summary"]["active"]) == (True, 1, True)
    assert one["context"]["messages"] == second_context
    two = revert(api, conversation, 1).json()
    assert two["reverted"] and two["summary"] is None
    assert two["context"]["messages"] == [*first_context, *more]
    assert_context_invariants(conversation, original_messages=[*originals, *more])


def test_only_the_active_version_can_be_reverted(api, booking):
    conversation, _ = booking
    compact(api, conversation)
    api.post(
        api_url("message-list", conversation),
        {"messages": [long_user_message(f"m{index}") for index in range(4)]},
        format="json",
    )
    compact(api, conversation)
    before = state(conversation)

    response = revert(api, conversation, 1)

    assert response.status_code == 400, response.content
    assert field_errors(response) == {
        "version": [
            "Version 1 is not the active summary (the active one is v2); only the active "
            "summary can be reverted."
        ]
    }
    assert state(conversation) == before
    missing = revert(api, conversation, 3)
    assert (missing.status_code, missing.json()) == (404, NO_SUCH_SUMMARY)
    assert state(conversation) == before


def test_a_conversation_without_a_summary_is_404_then_400_once_all_are_reverted(api, booking):
    conversation, _ = booking
    response = revert(api, conversation, 1)
    assert (response.status_code, response.json()) == (404, NO_SUCH_SUMMARY)
    compact(api, conversation)
    assert revert(api, conversation, 1).status_code == 200
    again = revert(api, conversation, 1)
    assert again.status_code == 400
    errors = field_errors(again)
    assert list(errors) == ["version"] and "none to revert" in errors["version"][0]


@pytest.mark.parametrize(
    "version",
    ["0", "-1", "01", "+1", "1.0", "1e3", "abc", "%20", "%D9%A1", "2147483648", "9" * 30, "v1"],
)
def test_a_version_no_summary_has_is_404_json(api, booking, version):
    conversation, _ = booking
    compact(api, conversation)
    before = state(conversation)
    url = api_url("summary-revert", conversation, version="1").replace(
        "/summaries/1/", f"/summaries/{version}/"
    )
    response = api.post(url)
    assert response.status_code == 404, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json() == NO_SUCH_SUMMARY
    assert state(conversation) == before


@pytest.mark.parametrize("body", [{"force": True}, {"version": 1}, {"": None}])
def test_a_body_with_any_field_is_refused_and_nothing_changes(api, booking, body):
    conversation, _ = booking
    compact(api, conversation)
    before = state(conversation)
    response = revert(api, conversation, 1, data=body, format="json")
    assert response.status_code == 400, response.content
    assert [error["field"] for error in response.json()["errors"]] == list(body)
    assert field_codes(response) == {name: ["unknown_field"] for name in body}
    assert state(conversation) == before


@pytest.mark.parametrize("body", ["[]", "null", '"x"', "1", "{", "\x00"])
def test_a_body_that_is_not_an_object_is_refused(api, booking, body):
    conversation, _ = booking
    compact(api, conversation)
    before = state(conversation)
    response = api.generic(
        "POST",
        api_url("summary-revert", conversation, version=1),
        body,
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/json"
    assert state(conversation) == before


def test_a_form_body_is_415(api, booking):
    conversation, _ = booking
    compact(api, conversation)
    before = state(conversation)
    response = api.post(
        api_url("summary-revert", conversation, version=1), {"a": "b"}, format="multipart"
    )
    assert response.status_code == 415
    assert state(conversation) == before


def test_a_revert_while_a_compaction_holds_the_lease_is_in_progress(api, booking):
    conversation, _ = booking
    compact(api, conversation)
    Conversation.objects.filter(pk=conversation.pk).update(lease_owner="another-worker")
    before = state(conversation)
    response = revert(api, conversation, 1)
    assert response.status_code == 200
    body = response.json()
    assert (body["reverted"], body["reason"], body["reverted_version"]) == (
        False,
        "in_progress",
        1,
    )
    assert (body["messages_restored"], body["summary"]) == (0, None)
    assert body["context"]["summary"]["version"] == 1  # still compacted
    assert state(conversation) == before


def test_a_revert_retried_with_its_key_is_not_run_again(api, booking):
    conversation, _ = booking
    compact(api, conversation)
    first = revert(api, conversation, 1, HTTP_IDEMPOTENCY_KEY="revert-1")
    retry = revert(api, conversation, 1, HTTP_IDEMPOTENCY_KEY="revert-1")
    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json() and retry["Idempotent-Replayed"] == "true"
    reverts = CompactionAttempt.objects.filter(conversation=conversation, reason="reverted")
    assert reverts.count() == 1
    again = revert(api, conversation, 1, HTTP_IDEMPOTENCY_KEY="revert-2")
    assert again.status_code == 400  # a new key is a new request: nothing left to revert


def test_a_compaction_by_the_openai_client_is_reverted(api, user, openai_summarizer):
    openai_summarizer.reply = "Ana flies AI-101 on October 20."
    history = booking_history()
    conversation = services.conversation_create(
        owner=user, system=SYSTEM, messages=history, **POLICY
    )
    before = api.get(api_url("context", conversation)).json()
    compacted = compact(api, conversation)
    assert compacted["summary"]["text"] == openai_summarizer.reply
    assert compacted["summary"]["model"] == "summary-model-1"

    body = revert(api, conversation, 1).json()

    assert body["reverted"] and body["context"]["messages"] == before["messages"]
    assert body["context"]["token_count"] == before["token_count"]
    assert len(openai_summarizer.requests) == 1  # a revert calls no model
    assert_context_invariants(
        conversation, original_messages=[{"role": "system", "content": SYSTEM}, *history]
    )
