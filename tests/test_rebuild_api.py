"""Rebuilding stale summaries and redacting messages over REST:
``POST …/summaries/rebuild/`` and ``POST …/messages/{seq}/redact/``."""

from __future__ import annotations

import pytest

from ctxsum import services
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.services.redaction import REDACTED, WITHHELD
from tests.factories import CARD as SECRET
from tests.factories import booked_conversation, booking_history
from tests.invariants import assert_context_invariants
from tests.support.errors import field_codes
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

TURNS = booking_history()


@pytest.fixture
def compacted(user, offline_summarizer):
    return booked_conversation(user)


def state(conversation: Conversation) -> tuple:
    """Everything a refused request must leave as it was."""
    row = Conversation.objects.get(pk=conversation.pk)
    return (
        row.revision,
        row.active_tokens,
        row.lease_owner,
        list(Message.objects.filter(conversation=row).values_list("seq", "content", "summary")),
        list(Summary.objects.filter(conversation=row).values_list("pk", "active", "text")),
    )


def test_a_new_prompt_version_shows_the_summary_stale_and_the_endpoint_rebuilds_it(
    api, compacted, settings
):
    summaries = api.get(api_url("summary-list", compacted)).json()["results"]
    assert [(s["version"], s["stale"], s["origin"]) for s in summaries] == [
        (1, False, "compaction")
    ]
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    assert api.get(api_url("summary-list", compacted)).json()["results"][0]["stale"]

    response = api.post(api_url("summary-rebuild", compacted))

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["rebuilt"], body["reason"], body["replaced_version"]) == (True, "rebuilt", 1)
    new = body["summary"]
    assert (new["version"], new["origin"], new["prompt_version"], new["stale"]) == (
        2,
        "rebuild",
        "2",
        False,
    )
    old = Summary.objects.get(conversation=compacted, version=1)
    assert new["covers"] == {"from_seq": old.from_seq, "to_seq": old.to_seq}
    assert body["context"]["summary"]["version"] == 2
    assert body["context"]["messages"][1]["content"].endswith(new["text"])
    listed = api.get(api_url("summary-list", compacted)).json()["results"]
    assert [(s["version"], s["active"], s["superseded"]) for s in listed] == [
        (2, True, False),
        (1, False, True),
    ]
    assert_context_invariants(compacted)


def test_a_redacted_message_leaves_the_rebuilt_summary(api, compacted):
    assert SECRET in Summary.objects.get(conversation=compacted, active=True).text
    revision = Conversation.objects.get(pk=compacted.pk).revision

    response = api.post(api_url("message-redact", compacted, seq=4), {}, format="json")

    assert response.status_code == 200, response.content
    message = response.json()
    assert (message["seq"], message["role"], message["content"]) == (4, "assistant", REDACTED)
    assert message["archived"]
    assert Conversation.objects.get(pk=compacted.pk).revision == revision + 1
    # Withheld at once: stale, its text a notice, the context without the secret.
    summary = api.get(api_url("summary-list", compacted)).json()["results"][0]
    assert summary["stale"] and summary["text"] == WITHHELD
    assert SECRET not in str(api.get(api_url("context", compacted)).json())

    rebuilt = api.post(api_url("summary-rebuild", compacted)).json()

    assert rebuilt["rebuilt"] and SECRET not in rebuilt["summary"]["text"]
    transcript = api.get(api_url("message-list", compacted)).json()["results"]
    assert SECRET not in str(transcript)
    assert_context_invariants(compacted)


def test_redacting_an_active_message_recounts_the_context(api, compacted):
    last = Message.objects.filter(conversation=compacted).order_by("-seq").first()
    before = api.get(api_url("context", compacted)).json()
    assert before["messages"][-1]["content"] == last.content

    message = api.post(api_url("message-redact", compacted, seq=last.seq)).json()

    after = api.get(api_url("context", compacted)).json()
    assert after["messages"][-1]["content"] == REDACTED
    assert after["token_count"] == before["token_count"] - last.token_count + message["token_count"]
    assert after["revision"] == before["revision"] + 1
    again = api.post(api_url("message-redact", compacted, seq=last.seq))
    assert again.status_code == 200 and again.json() == message  # nothing changes again
    assert api.get(api_url("context", compacted)).json()["revision"] == after["revision"]


@pytest.mark.parametrize(
    "seq",
    ["99", "-1", "01", "+1", "1.0", "1e3", "abc", "%20", "%D9%A1", "2147483648", "9" * 30],
)
def test_a_seq_no_message_has_is_404_json(api, compacted, seq):
    before = state(compacted)
    url = api_url("message-redact", compacted, seq="0").replace("/messages/0/", f"/messages/{seq}/")
    response = api.post(url)
    assert response.status_code == 404, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "not_found"
    assert state(compacted) == before


@pytest.mark.parametrize("name", ["summary-rebuild", "message-redact"])
@pytest.mark.parametrize("body", [{"force": True}, {"seq": 1}, {"": None}])
def test_a_body_with_any_field_is_refused_and_nothing_changes(api, compacted, name, body):
    before = state(compacted)
    path = {"seq": 1} if name == "message-redact" else {}
    response = api.post(api_url(name, compacted, **path), body, format="json")
    assert response.status_code == 400, response.content
    assert [error["field"] for error in response.json()["errors"]] == list(body)
    assert field_codes(response) == {name: ["unknown_field"] for name in body}
    assert state(compacted) == before


@pytest.mark.parametrize("body", ["[]", "null", '"x"', "1", "{"])
def test_a_body_that_is_not_an_object_is_refused(api, compacted, body):
    before = state(compacted)
    response = api.generic(
        "POST", api_url("summary-rebuild", compacted), body, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/json"
    assert state(compacted) == before


def test_a_conversation_without_a_summary_has_nothing_to_rebuild(api, user, offline_summarizer):
    conversation = services.conversation_create(owner=user, messages=TURNS[:2])
    response = api.post(api_url("summary-rebuild", conversation))
    assert response.status_code == 200
    body = response.json()
    assert (body["rebuilt"], body["reason"], body["summary"], body["replaced_version"]) == (
        False,
        "nothing_to_summarize",
        None,
        None,
    )
    assert body["context"]["messages"] == TURNS[:2]


def test_a_rebuild_while_a_compaction_holds_the_lease_is_in_progress(api, compacted):
    Conversation.objects.filter(pk=compacted.pk).update(lease_owner="another-worker")
    before = state(compacted)
    body = api.post(api_url("summary-rebuild", compacted)).json()
    assert (body["rebuilt"], body["reason"], body["replaced_version"]) == (
        False,
        "in_progress",
        1,
    )
    assert state(compacted) == before


def test_a_failing_summarizer_is_502_and_changes_nothing(
    api, compacted, openai_summarizer, openai_server
):
    openai_server.mode = "error"
    before = state(compacted)
    response = api.post(api_url("summary-rebuild", compacted))
    assert response.status_code == 502, response.content
    assert (response.json()["code"], response.json()["reason"]) == (
        "summarizer_error",
        "summarizer_error",
    )
    assert len(openai_server.requests) == 1  # never retried
    assert state(compacted) == before
    attempt = CompactionAttempt.objects.filter(conversation=compacted).latest("created_at")
    assert attempt.outcome == "failed"


def test_a_rebuild_through_the_openai_client_writes_the_servers_answer(
    api, compacted, openai_summarizer, openai_server, settings
):
    openai_server.reply = "Ana flies AI-101 on October 20, seat 14A."
    response = api.post(api_url("summary-rebuild", compacted))
    assert response.status_code == 200, response.content
    assert response.json()["summary"]["text"] == openai_server.reply
    sent = openai_server.requests[-1]["body"]["messages"][-1]["content"]
    assert "AI-101" in sent and "<summary-so-far>" not in sent  # from the originals alone


def test_a_rebuild_retried_with_its_key_is_not_run_again(api, compacted, settings):
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    url = api_url("summary-rebuild", compacted)
    first = api.post(url, HTTP_IDEMPOTENCY_KEY="rebuild-1")
    retry = api.post(url, HTTP_IDEMPOTENCY_KEY="rebuild-1")
    assert first.status_code == retry.status_code == 200
    assert retry.json() == first.json() and retry["Idempotent-Replayed"] == "true"
    assert Summary.objects.filter(conversation=compacted).count() == 2  # one rebuild only
    again = api.post(url, HTTP_IDEMPOTENCY_KEY="rebuild-2")
    assert again.json()["summary"]["version"] == 3  # a new key is a new rebuild
