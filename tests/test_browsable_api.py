"""OPTIONS and the browsable API on every endpoint: JSON metadata and HTML pages, never a
500. Each view names the serializer of what it takes, so both can describe it."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ctxsum.services import conversation_create

pytestmark = pytest.mark.django_db

ENDPOINTS = [
    ("ctxsum:api-root", False, {"GET"}),
    ("ctxsum:conversation-list", False, {"GET", "POST"}),
    ("ctxsum:conversation-detail", True, {"GET", "PATCH", "DELETE"}),
    ("ctxsum:message-list", True, {"GET", "POST"}),
    ("ctxsum:context", True, {"GET"}),
    ("ctxsum:compact", True, {"POST"}),
    ("ctxsum:summary-list", True, {"GET"}),
    ("ctxsum:summary-rebuild", True, {"POST"}),
    ("ctxsum:message-redact", True, {"POST"}),
    ("ctxsum:summary-revert", True, {"POST"}),
    ("ctxsum:chat", True, {"POST"}),
]
# The path beyond the conversation's id.
PATHS = {"ctxsum:message-redact": {"seq": 1}, "ctxsum:summary-revert": {"version": 1}}
# Operations whose body has no field.
NO_FIELDS = {"ctxsum:summary-rebuild", "ctxsum:message-redact", "ctxsum:summary-revert"}


@pytest.fixture
def conversation(user):
    return conversation_create(
        owner=user, system="Be brief.", messages=[{"role": "user", "content": "Hello"}]
    )


def url_of(name: str, needs_pk: bool, conversation) -> str:
    if not needs_pk:
        return reverse(name)
    return reverse(name, kwargs={"pk": conversation.pk, **PATHS.get(name, {})})


@pytest.mark.parametrize(("name", "needs_pk", "methods"), ENDPOINTS)
def test_options_describes_the_endpoint_in_json(api, conversation, name, needs_pk, methods):
    response = api.options(url_of(name, needs_pk, conversation))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    allowed = {method.strip() for method in response["Allow"].split(",")}
    assert methods <= allowed
    if "POST" in methods:
        # The input serializer's fields, as DRF's metadata describes them.
        fields = response.json()["actions"]["POST"]
        assert bool(fields) == (name not in NO_FIELDS), fields


def test_options_lists_the_create_fields(api, conversation):
    actions = api.options(reverse("ctxsum:conversation-list")).json()["actions"]["POST"]
    assert {"title", "system", "metadata", "model", "policy", "messages"} <= set(actions)


@pytest.mark.parametrize(("name", "needs_pk", "methods"), ENDPOINTS)
def test_the_browsable_api_renders_every_endpoint(api, conversation, name, needs_pk, methods):
    response = api.get(url_of(name, needs_pk, conversation), HTTP_ACCEPT="text/html")
    expected = 200 if "GET" in methods else 405
    assert response.status_code == expected
    assert response["Content-Type"].startswith("text/html")
    assert b"Django REST framework" in response.content


def test_options_of_someone_elses_conversation_reveals_nothing(other_api, conversation):
    response = other_api.options(reverse("ctxsum:compact", kwargs={"pk": conversation.pk}))
    # Metadata describes the endpoint, not the conversation: no field of it appears.
    assert response.status_code == 200
    assert str(conversation.pk) not in response.content.decode()
