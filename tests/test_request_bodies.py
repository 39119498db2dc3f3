"""Bodies the API cannot store are refused with a 4xx, never a 500: a number past what its
column holds (a 400 naming the field; PostgreSQL's integer column overflows at 2**31,
SQLite's at 2**63), and a body that is not JSON (a 415: the API takes JSON only). Both were
500s: the first on create and PATCH, the second for a multipart form with a file where a
message's field should be."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from ctxsum.models import Conversation, Message
from ctxsum.policy import MAX_CONTEXT_TOKENS_LIMIT as MAX_COLUMN_INTEGER
from ctxsum.policy import TOO_LARGE
from ctxsum.services import conversation_create
from tests.support.errors import field_errors

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value", [MAX_COLUMN_INTEGER + 1, 3_000_000_000, 10**30])
def test_a_ceiling_past_the_column_is_refused_on_create(api, value):
    response = api.post(
        reverse("ctxsum:conversation-list"),
        {"policy": {"max_context_tokens": value}},
        format="json",
    )
    assert response.status_code == 400, response.content
    expected = TOO_LARGE.format(field="max_context_tokens", limit=MAX_COLUMN_INTEGER, value=value)
    assert field_errors(response) == {"policy.max_context_tokens": [expected]}
    assert not Conversation.objects.exists()


def test_a_ceiling_past_the_column_is_refused_on_patch(api):
    pk = api.post(reverse("ctxsum:conversation-list"), {}, format="json").json()["id"]
    url = reverse("ctxsum:conversation-detail", kwargs={"pk": pk})
    response = api.patch(url, {"policy": {"max_context_tokens": 2**40}}, format="json")
    assert response.status_code == 400, response.content
    assert list(field_errors(response)) == ["policy.max_context_tokens"]
    assert Conversation.objects.get(pk=pk).max_context_tokens is None


def test_the_service_refuses_it_too(user):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as refused:
        conversation_create(owner=user, max_context_tokens=MAX_COLUMN_INTEGER + 1)
    assert list(refused.value.message_dict) == ["max_context_tokens"]
    assert not Conversation.objects.exists()


def test_the_largest_ceiling_the_column_holds_is_taken(api):
    response = api.post(
        reverse("ctxsum:conversation-list"),
        {"policy": {"max_context_tokens": MAX_COLUMN_INTEGER}},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["policy"]["max_context_tokens"] == MAX_COLUMN_INTEGER


def upload() -> SimpleUploadedFile:
    return SimpleUploadedFile("note.txt", b"hello")


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("message-list", {"role": "user", "content": upload()}),
        ("message-list", {"role": "user", "content": "hi"}),
        ("conversation-list", {"title": upload()}),
        ("compact", {"force": "true"}),
    ],
)
@pytest.mark.parametrize("body_format", ["multipart", "form"])
def test_a_body_that_is_not_json_is_a_415(api, user, name, body, body_format):
    conversation = conversation_create(owner=user)
    kwargs = {} if name == "conversation-list" else {"pk": conversation.pk}
    url = reverse(f"ctxsum:{name}", kwargs=kwargs)
    if body_format == "form":
        fields = {key: value if isinstance(value, str) else "x" for key, value in body.items()}
        form = "application/x-www-form-urlencoded"
        response = api.generic("POST", url, urlencode(fields), content_type=form)
    else:
        response = api.post(url, body, format="multipart")
    assert response.status_code == 415, response.content
    assert response.json()["code"] == "unsupported_media_type"
    assert Conversation.objects.count() == 1 and not Message.objects.exists()


def test_a_patch_with_a_multipart_body_is_a_415(api, user):
    conversation = conversation_create(owner=user, title="Before")
    url = reverse("ctxsum:conversation-detail", kwargs={"pk": conversation.pk})
    response = api.patch(url, {"title": upload()}, format="multipart")
    assert response.status_code == 415, response.content
    conversation.refresh_from_db()
    assert conversation.title == "Before"
