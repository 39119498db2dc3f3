"""The Idempotency-Key header on append and compact: a retry with the same key is answered
with the first answer and stores nothing new; the same key on another request is a 409; an
error answer is not kept; keys belong to a user and a conversation and expire. The
summarizer is the real openai backend on a local fake server, so "no second call" is
counted where the call would arrive. The races are in tests/test_idempotency_races.py."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from ctxsum.api.idempotency import (
    ANSWER_LOST,
    INVALID_KEY,
    KEY_IN_PROGRESS,
    KEY_REUSED,
    REPLAYED_HEADER,
)
from ctxsum.conf import ctxsum_settings
from ctxsum.models import Conversation, IdempotencyKey, Message, Summary
from ctxsum.services import LeaseLost, conversation_create, message_append
from ctxsum.services.idempotency import (
    Claim,
    fingerprint,
    key_claim,
    keys_expired_delete,
)
from tests.factories import user_message, weather_history
from tests.support.errors import field_codes, field_errors
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
MESSAGE = user_message("Is the 9:40 train on time?")


@pytest.fixture
def conversation(user) -> Conversation:
    return conversation_create(
        owner=user, system="You are a travel assistant.", messages=weather_history(), **POLICY
    )


def post(api, name: str, conversation: Any, body: Any, key: str | None = None, **extra: Any):
    """POST ``body`` as JSON text, with ``key`` as the Idempotency-Key when given."""
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    text = json.dumps(body)
    return api.generic(
        "POST", api_url(name, conversation), text, content_type="application/json", **extra
    )


def append(api, conversation: Any, body: Any = MESSAGE, key: str | None = "k-1"):
    return post(api, "message-list", conversation, body, key)


def compact(api, conversation: Any, body: Any = None, key: str | None = "k-1"):
    return post(api, "compact", conversation, {} if body is None else body, key)


def count(conversation: Conversation) -> int:
    return Message.objects.filter(conversation_id=conversation.pk).count()


def keys() -> list[tuple[str, str]]:
    return list(IdempotencyKey.objects.order_by("pk").values_list("key", "state"))


def assert_error(response, status: int, code: str, detail: Any) -> None:
    assert response.status_code == status, response.content
    assert response.json() == {"detail": str(detail), "code": code}
    assert REPLAYED_HEADER not in response


# --------------------------------------------------------------------------- append


def test_an_append_retried_with_its_key_answers_the_first_answer_and_stores_nothing(
    api, conversation
):
    first = append(api, conversation)
    before = Conversation.objects.get(pk=conversation.pk)

    retry = append(api, conversation)

    assert first.status_code == retry.status_code == 201
    assert retry.content == first.content  # the same bytes, keys in the same order
    assert retry[REPLAYED_HEADER] == "true" and REPLAYED_HEADER not in first
    after = Conversation.objects.get(pk=conversation.pk)
    assert (after.message_count, after.revision) == (before.message_count, before.revision)
    assert count(conversation) == before.message_count
    assert keys() == [("k-1", "done")]


def test_a_new_key_is_a_new_append(api, conversation):
    append(api, conversation, key="k-1")
    append(api, conversation, key="k-2")
    append(api, conversation, key=None)
    assert count(conversation) == len(weather_history()) + 1 + 3


def test_the_same_key_with_another_body_is_a_409_and_stores_nothing(api, conversation):
    first = append(api, conversation)
    before = count(conversation)

    other = append(api, conversation, user_message("Is the 10:40 train on time?"))
    # A batch of the same message is another body too.
    batch = append(api, conversation, {"messages": [MESSAGE]})

    for response in (other, batch):
        assert_error(response, 409, "idempotency_key_reused", KEY_REUSED)
    assert count(conversation) == before
    # The first answer is still the key's.
    assert append(api, conversation).content == first.content


def test_the_same_key_on_append_then_compact_is_a_409(api, conversation, openai_summarizer):
    append(api, conversation, key="shared")

    response = compact(api, conversation, {"force": True}, key="shared")

    assert_error(response, 409, "idempotency_key_reused", KEY_REUSED)
    assert openai_summarizer.requests == []
    assert not Summary.objects.exists()


def test_keys_belong_to_a_conversation_and_a_user(api, other_api, conversation, user, other_user):
    second = conversation_create(owner=user)
    theirs = conversation_create(owner=other_user)

    answers = [
        append(api, conversation, key="same"),
        append(api, second, key="same"),
        append(other_api, theirs, key="same"),
    ]

    assert [response.status_code for response in answers] == [201, 201, 201]
    assert not any(REPLAYED_HEADER in response for response in answers)
    assert [count(c) for c in (second, theirs)] == [1, 1]
    # Someone else's conversation answers 404 with or without a key: nothing of it leaks.
    intruder = append(other_api, conversation, key="same")
    assert intruder.status_code == 404 and IdempotencyKey.objects.count() == 3


def test_a_refused_append_keeps_no_answer_and_the_key_stays_free(api, conversation):
    orphan = {"role": "tool", "tool_call_id": "call_nobody_made", "content": "42"}
    before = count(conversation)

    refused = append(api, conversation, orphan)

    assert refused.status_code == 400 and "tool_call_id" in field_errors(refused)
    assert field_codes(refused)["tool_call_id"] == ["unknown_tool_call"]
    assert keys() == [] and count(conversation) == before
    # The key was not spent: the client may send a corrected body with it.
    assert append(api, conversation).status_code == 201
    assert count(conversation) == before + 1


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("", id="empty"),
        pytest.param("k" * 256, id="256-chars"),
        pytest.param("k" * 300, id="300-chars"),
        pytest.param("caf\xc3\xa9", id="utf8-bytes-as-wsgi-latin1"),
        pytest.param("caf\xe9", id="latin1"),
        pytest.param("a\tb", id="tab"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("a\x7fb", id="del"),
        pytest.param("a b", id="space"),
        pytest.param("a\r\nX-Injected: 1", id="crlf"),
    ],
)
@pytest.mark.parametrize("endpoint", ["message-list", "compact"])
def test_a_key_that_is_not_one_is_a_400_naming_the_header(api, conversation, endpoint, key):
    before = Conversation.objects.values("revision", "message_count").get(pk=conversation.pk)

    response = post(api, endpoint, conversation, MESSAGE if endpoint == "message-list" else {}, key)

    assert_error(response, 400, "invalid_idempotency_key", INVALID_KEY)
    assert "Idempotency-Key" in response.json()["detail"]
    assert response["Content-Type"] == "application/json"
    assert keys() == []
    assert Conversation.objects.values("revision", "message_count").get(pk=conversation.pk) == (
        before
    )


def test_a_keyed_body_that_is_not_json_is_a_415_and_spends_no_key(api, conversation):
    response = api.post(
        api_url("message-list", conversation),
        {"role": "user", "content": "hi"},
        format="multipart",
        HTTP_IDEMPOTENCY_KEY="k-1",
    )
    assert response.status_code == 415 and keys() == []


def session_client(client, user) -> APIClient:
    """A client logged in with a session, whose requests pass Django's CSRF check."""
    secret = "a" * 32
    client.force_login(user)
    client.cookies[settings.CSRF_COOKIE_NAME] = secret
    api = APIClient(enforce_csrf_checks=True, HTTP_X_CSRFTOKEN=secret)
    api.cookies = client.cookies
    return api


def test_a_session_login_whose_csrf_check_parses_the_body_is_replayed_too(
    client, user, conversation
):
    # The CSRF check of a session login parses the body during authentication, before
    # the view runs: the raw bytes the key's fingerprint hashes are kept before that.
    api = session_client(client, user)
    before = count(conversation)
    first = append(api, conversation)
    retry = append(api, conversation)
    other = append(api, conversation, user_message("Another question."))

    assert first.status_code == 201, first.content
    assert retry[REPLAYED_HEADER] == "true" and retry.content == first.content
    assert other.status_code == 409
    assert count(conversation) == before + 1


@pytest.mark.parametrize("key", ["k", "k" * 255, '"8e03978e-40d5-43e8"', "!~{}"])
def test_every_visible_ascii_key_up_to_255_characters_is_taken(api, conversation, key):
    assert append(api, conversation, key=key).status_code == 201
    assert append(api, conversation, key=key)[REPLAYED_HEADER] == "true"
    assert keys() == [(key, "done")]


def test_an_expired_key_is_free_again(api, conversation):
    append(api, conversation)
    expired = timezone.now() - timedelta(seconds=ctxsum_settings.IDEMPOTENCY_KEY_SECONDS + 1)
    IdempotencyKey.objects.update(created_at=expired)
    before = count(conversation)

    again = append(api, conversation)
    assert again.status_code == 201 and REPLAYED_HEADER not in again
    assert count(conversation) == before + 1
    # Replaced, not added: the key's row now holds the new answer.
    assert append(api, conversation).content == again.content
    assert IdempotencyKey.objects.get().created_at > expired


def test_an_expired_key_takes_another_body(api, conversation, settings):
    settings.CTXSUM = {"IDEMPOTENCY_KEY_SECONDS": 60}
    append(api, conversation)
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(seconds=61))
    other = append(api, conversation, user_message("Another question."))
    assert other.status_code == 201 and other.json()["messages"][0]["content"] == (
        "Another question."
    )


# --------------------------------------------------------------------------- compact


def test_a_compaction_retried_with_its_key_is_not_run_again(api, conversation, openai_summarizer):
    first = compact(api, conversation)
    assert first.status_code == 200 and first.json()["compacted"] is True

    retry = compact(api, conversation)

    assert retry.status_code == 200 and retry.content == first.content
    assert retry[REPLAYED_HEADER] == "true"
    assert len(openai_summarizer.requests) == 1
    assert Summary.objects.filter(conversation=conversation).count() == 1
    # Without the key, the same request runs: the context is below the trigger now.
    assert compact(api, conversation, key=None).json()["reason"] == "below_trigger"


def test_a_summarizer_failure_is_not_kept_and_the_retry_runs(api, conversation, openai_summarizer):
    openai_summarizer.mode = "error"
    failed = compact(api, conversation)
    assert failed.status_code == 502 and failed.json()["code"] == "summarizer_error"
    assert keys() == []

    openai_summarizer.mode = "ok"
    retry = compact(api, conversation)

    assert retry.status_code == 200 and retry.json()["compacted"] is True
    assert REPLAYED_HEADER not in retry
    assert len(openai_summarizer.requests) == 2
    assert compact(api, conversation)[REPLAYED_HEADER] == "true"
    assert len(openai_summarizer.requests) == 2


def test_a_dry_run_and_a_compaction_are_two_requests(api, conversation, openai_summarizer):
    assert compact(api, conversation, {"dry_run": True}).json()["reason"] == "dry_run"
    response = compact(api, conversation, {})
    assert_error(response, 409, "idempotency_key_reused", KEY_REUSED)
    assert openai_summarizer.requests == []


# The automatic compaction runs once the append has committed: outside a test transaction.
@pytest.mark.django_db(transaction=True)
def test_a_replayed_append_answers_its_automatic_compaction_too(
    api, user, openai_summarizer, settings
):
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "sync"}
    conversation = conversation_create(owner=user, messages=weather_history()[:5], **POLICY)

    first = append(api, conversation)
    retry = append(api, conversation)

    assert first.json()["compaction"]["compacted"] is True
    assert retry.content == first.content and retry[REPLAYED_HEADER] == "true"
    assert len(openai_summarizer.requests) == 1
    assert count(conversation) == 6


# --------------------------------------------------------------------------- dead workers


def claim_as(api, conversation: Conversation, body: Any, key: str = "k-1") -> Claim:
    """The claim the REST append of ``body`` with ``key`` takes, taken here: a request
    whose worker dies before answering."""
    operation = "POST MessageList"
    claimed = key_claim(
        owner=conversation.owner,
        conversation=conversation,
        key=key,
        operation=operation,
        fingerprint=fingerprint("POST", operation, json.dumps(body).encode()),
    )
    assert isinstance(claimed, Claim)
    return claimed


def abandon() -> None:
    """Age every claim past IDEMPOTENCY_CLAIM_SECONDS."""
    seconds = ctxsum_settings.IDEMPOTENCY_CLAIM_SECONDS + 1
    IdempotencyKey.objects.update(claimed_at=timezone.now() - timedelta(seconds=seconds))


def test_a_request_still_running_turns_its_retry_away(api, conversation):
    claim_as(api, conversation, MESSAGE)
    before = count(conversation)

    response = append(api, conversation)

    assert_error(response, 409, "idempotency_key_in_progress", KEY_IN_PROGRESS)
    assert count(conversation) == before


def test_a_claim_whose_worker_died_before_writing_is_taken_over(api, conversation):
    claim_as(api, conversation, MESSAGE)
    abandon()
    before = count(conversation)

    response = append(api, conversation)

    assert response.status_code == 201 and REPLAYED_HEADER not in response
    assert count(conversation) == before + 1
    assert append(api, conversation)[REPLAYED_HEADER] == "true"
    assert count(conversation) == before + 1


def test_an_append_applied_by_a_worker_that_died_before_answering_is_never_repeated(
    api, conversation
):
    claim = claim_as(api, conversation, MESSAGE)
    # The append commits with its claim marked applied; then the worker dies.
    message_append(conversation=conversation, messages=[MESSAGE], idempotency=claim)
    after_first = count(conversation)

    still_claimed = append(api, conversation)
    abandon()
    lost = append(api, conversation)

    assert_error(still_claimed, 409, "idempotency_key_in_progress", KEY_IN_PROGRESS)
    assert_error(lost, 409, "idempotency_key_answer_lost", ANSWER_LOST)
    assert count(conversation) == after_first
    # Another body under the key is still another request.
    other = append(api, conversation, user_message("Something else."))
    assert_error(other, 409, "idempotency_key_reused", KEY_REUSED)


def test_a_worker_whose_claim_was_taken_over_writes_nothing(api, conversation):
    slow = claim_as(api, conversation, MESSAGE)
    abandon()
    takeover = claim_as(api, conversation, MESSAGE)
    assert takeover.token != slow.token and takeover.pk == slow.pk
    before = count(conversation)

    with pytest.raises(LeaseLost):
        message_append(conversation=conversation, messages=[MESSAGE], idempotency=slow)

    assert count(conversation) == before
    message_append(conversation=conversation, messages=[MESSAGE], idempotency=takeover)
    assert count(conversation) == before + 1


# --------------------------------------------------------------------------- cleanup


def test_cleanup_deletes_expired_keys_only(api, conversation, user):
    append(api, conversation, key="old")
    append(api, conversation, key="new")
    claim_as(api, conversation, MESSAGE, key="running")
    day = timedelta(seconds=ctxsum_settings.IDEMPOTENCY_KEY_SECONDS + 1)
    IdempotencyKey.objects.filter(key__in=["old", "running"]).update(
        created_at=timezone.now() - day
    )

    out = StringIO()
    call_command("ctxsum_cleanup_idempotency", stdout=out)

    assert out.getvalue() == "Deleted 1 expired idempotency key(s).\n"
    # A request that still holds its claim keeps it, however old the key.
    assert sorted(key for key, _ in keys()) == ["new", "running"]
    abandon()
    assert keys_expired_delete() == 1 and [key for key, _ in keys()] == ["new"]


def test_keys_go_with_their_conversation(api, conversation):
    append(api, conversation)
    api.delete(api_url("conversation-detail", conversation))
    assert not IdempotencyKey.objects.exists()


# --------------------------------------------------------------------------- schema


def test_the_schema_describes_the_header_and_the_409_where_a_key_is_taken():
    document = SchemaGenerator().get_schema(request=None, public=True)
    keyed = set()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            headers = [p for p in operation.get("parameters", []) if p["in"] == "header"]
            if headers:
                (header,) = headers
                assert header["name"] == "Idempotency-Key" and not header.get("required")
                assert header["schema"]["pattern"] == "^[!-~]{1,255}$"
                codes = list(operation["responses"])
                assert "409" in codes and codes == sorted(codes)
                keyed.add(operation["operationId"])
            else:
                assert "409" not in operation["responses"], (path, method)
    assert keyed == {
        "messages_create",
        "conversations_compact",
        "summaries_rebuild",
        "summaries_revert",
        "conversations_chat",
        "facts_create",
    }
