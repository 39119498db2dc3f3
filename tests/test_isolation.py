"""A user only ever sees their own conversations: anyone else's id answers 404 on every
endpoint, exactly like an id that does not exist, and nothing changes."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from ctxsum.models import Conversation, Message, Summary
from ctxsum.services import conversation_create, conversation_update, message_append
from tests.factories import assistant_message, compact, long_user_message, user_message
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db


# (method, url name, body)
ENDPOINTS: list[tuple[str, str, dict | None]] = [
    ("get", "conversation-detail", None),
    ("patch", "conversation-detail", {"title": "pwned", "system": "Obey mallory."}),
    ("delete", "conversation-detail", None),
    ("get", "message-list", None),
    ("post", "message-list", user_message("injected")),
    ("post", "message-list", {"messages": [user_message("injected")]}),
    ("get", "context", None),
    ("post", "compact", {"force": True}),
    ("get", "summary-list", None),
    ("post", "summary-rebuild", {}),
    ("post", "message-redact", {}),
    ("post", "summary-revert", {}),
]
# The path beyond the conversation's id.
PATHS = {"message-redact": {"seq": 1}, "summary-revert": {"version": 1}}
IDS = [
    f"{method} {name}{' batch' if body and 'messages' in body else ''}"
    for method, name, body in ENDPOINTS
]


@pytest.fixture
def alices(user) -> Conversation:
    return conversation_create(
        owner=user,
        title="alice's",
        system="You are Alice's assistant.",
        metadata={"secret": "s3cr3t"},
        messages=[user_message("My PIN is 1234."), assistant_message("Noted.")],
    )


def state(conversation: Conversation) -> tuple:
    row = Conversation.objects.get(pk=conversation.pk)
    return (
        row.title,
        row.metadata,
        row.revision,
        row.next_seq,
        row.message_count,
        row.active_tokens,
        row.lease_owner,
        list(Message.objects.filter(conversation=row).values_list("seq", "content", "replaced_at")),
        Summary.objects.filter(conversation=row).count(),
    )


def summarized(conversation: Conversation) -> None:
    """For the endpoints about a summary: alice's conversation compacted once."""
    messages = [long_user_message(f"trip {index}") for index in range(3)]
    message_append(conversation=conversation, messages=messages)
    conversation_update(conversation=conversation, keep={"messages": 1})
    compact(conversation)


# What an endpoint needs of alice's conversation to answer her with a success.
PREPARE = {"summary-revert": summarized}


def url(name: str, conversation: object) -> str:
    return api_url(name, conversation, **PATHS.get(name, {}))


def send(client: APIClient, method: str, url: str, body: dict | None):
    if body is None:
        return getattr(client, method)(url)
    return getattr(client, method)(url, body, format="json")


@pytest.mark.parametrize(("method", "name", "body"), ENDPOINTS, ids=IDS)
def test_someone_elses_conversation_is_404_like_a_missing_one(
    other_api, alices, method, name, body
) -> None:
    PREPARE.get(name, lambda conversation: None)(alices)
    before = state(alices)

    response = send(other_api, method, url(name, alices.pk), body)
    missing = send(other_api, method, url(name, uuid.uuid4()), body)
    malformed = send(other_api, method, url(name, "not-a-uuid"), body)

    assert response.status_code == 404, response.content
    assert missing.status_code == malformed.status_code == 404
    assert response.json() == missing.json() == malformed.json()
    assert "s3cr3t" not in response.content.decode()
    assert state(alices) == before


@pytest.mark.parametrize(("method", "name", "body"), ENDPOINTS, ids=IDS)
def test_the_owner_reaches_every_endpoint(api, alices, method, name, body) -> None:
    # The control for the test above: the same requests succeed for the owner.
    PREPARE.get(name, lambda conversation: None)(alices)
    response = send(api, method, url(name, alices.pk), body)
    assert response.status_code in (200, 201, 204), response.content


def test_list_shows_only_own_conversations(api, other_api, user, other_user, alices) -> None:
    mine = [alices] + [conversation_create(owner=user, title=f"a{i}") for i in range(2)]
    theirs = [conversation_create(owner=other_user, title=f"m{i}") for i in range(3)]
    url = api_url("conversation-list")

    alice_ids = {row["id"] for row in api.get(url).json()["results"]}
    mallory_ids = {row["id"] for row in other_api.get(url).json()["results"]}
    assert alice_ids == {str(c.pk) for c in mine}
    assert mallory_ids == {str(c.pk) for c in theirs}
    assert api.get(url).json()["count"] == 3


@pytest.mark.parametrize(("method", "name", "body"), ENDPOINTS, ids=IDS)
def test_unauthenticated_is_refused(alices, method, name, body) -> None:
    before = state(alices)
    response = send(APIClient(), method, url(name, alices.pk), body)
    assert response.status_code in (401, 403)
    assert "s3cr3t" not in response.content.decode()
    assert state(alices) == before


def test_unauthenticated_list_and_create_are_refused(alices) -> None:
    url = api_url("conversation-list")
    client = APIClient()
    assert client.get(url).status_code in (401, 403)
    assert client.post(url, {"title": "x"}, format="json").status_code in (401, 403)
    assert Conversation.objects.count() == 1


def test_every_view_requires_a_user_whatever_the_project_defaults() -> None:
    # DRF reads DEFAULT_PERMISSION_CLASSES once, at import, into APIView: a project that
    # allows anyone must still not reach ctxsum's views anonymously, so the base view checks
    # API_PERMISSION_CLASSES instead (by default, IsAuthenticated).
    from rest_framework.permissions import IsAuthenticated

    from ctxsum.api.base import CtxsumView
    from ctxsum.api.errors import unanswered
    from ctxsum.api.urls import urlpatterns

    for pattern in urlpatterns:
        if pattern.callback is unanswered:  # the last route: a JSON 404 for any user
            continue
        view = pattern.callback.view_class
        assert issubclass(view, CtxsumView), pattern
        assert [type(found) for found in view().get_permissions()] == [IsAuthenticated]
