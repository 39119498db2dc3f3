"""Every error under the API's prefix is JSON with ``detail`` and a stable ``code``; an
unexpected exception answers a generic 500 and leaves its traceback in the log."""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client, RequestFactory
from django.urls import get_resolver, reverse

from ctxsum import selectors
from ctxsum.api import errors
from ctxsum.services import conversation_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(user):
    return conversation_create(owner=user, messages=[{"role": "user", "content": "Hello"}])


def assert_json_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    assert body["code"] == code and body["detail"], body
    return body


def test_an_exception_inside_a_view_is_a_json_500_with_its_traceback_logged(
    api, conversation, monkeypatch, caplog
):
    def broken(**kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(selectors, "context_get", broken)
    url = reverse("ctxsum:context", kwargs={"pk": conversation.pk})
    with caplog.at_level(logging.ERROR, logger="ctxsum"):
        response = api.get(url)
    body = assert_json_error(response, 500, "server_error")
    assert "secret internals" not in response.content.decode()
    assert body["detail"] == "A server error occurred; it has been logged."
    (record,) = [r for r in caplog.records if r.name == "ctxsum.api"]
    assert record.exc_info and record.exc_info[0] is RuntimeError
    assert f"GET {url}" in record.getMessage()


def test_an_unknown_url_under_the_api_is_a_json_404():
    response = Client().get(reverse("ctxsum:api-root") + "no/such/thing/")
    assert_json_error(response, 404, "not_found")


def test_an_unknown_url_elsewhere_is_djangos_page():
    response = Client().get("/no/such/page/")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")


def test_a_failure_outside_a_view_is_a_json_500_under_the_api():
    """What Django answers when something fails before or after the view (middleware)."""
    assert get_resolver().resolve_error_handler(500) is errors.server_error
    api_request = RequestFactory().get(reverse("ctxsum:api-root") + "conversations/")
    assert_json_error(errors.server_error(api_request), 500, "server_error")
    page = errors.server_error(RequestFactory().get("/"))
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")


def test_drf_errors_carry_a_code(api, conversation):
    url = reverse("ctxsum:conversation-detail", kwargs={"pk": conversation.pk})
    assert_json_error(api.put(url, {}, format="json"), 405, "method_not_allowed")
    # The example project authenticates by token first, so an anonymous call is a 401.
    response = Client().get(url, HTTP_ACCEPT="application/json")
    assert_json_error(response, 401, "not_authenticated")


def test_unsupported_media_type_is_json(api, conversation):
    url = reverse("ctxsum:message-list", kwargs={"pk": conversation.pk})
    response = api.generic("POST", url, "role=user", content_type="text/plain")
    assert_json_error(response, 415, "unsupported_media_type")


def test_a_body_that_is_not_json_is_a_json_400(api, conversation):
    url = reverse("ctxsum:message-list", kwargs={"pk": conversation.pk})
    response = api.generic("POST", url, "{not json", content_type="application/json")
    assert_json_error(response, 400, "parse_error")


@pytest.mark.parametrize("method", ["post", "patch"])
def test_a_chunked_body_is_refused_not_ignored(api, conversation, method):
    urls = {
        "post": reverse("ctxsum:conversation-list"),
        "patch": reverse("ctxsum:conversation-detail", kwargs={"pk": conversation.pk}),
    }
    count, revision = type(conversation).objects.count(), conversation.revision
    response = api.generic(
        method.upper(),
        urls[method],
        json.dumps({"title": "chunked"}),
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
    )
    assert_json_error(response, 411, "length_required")
    assert type(conversation).objects.count() == count
    conversation.refresh_from_db()
    assert conversation.revision == revision and conversation.title == ""


def test_a_body_over_django_upload_limit_is_a_json_413(api, conversation, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    url = reverse("ctxsum:message-list", kwargs={"pk": conversation.pk})
    response = api.post(url, {"role": "user", "content": "x" * 2000}, format="json")
    assert_json_error(response, 413, "too_large")


def test_a_body_over_max_body_bytes_is_a_json_413_naming_both_sizes(api, conversation):
    from ctxsum.conf import ctxsum_settings

    url = reverse("ctxsum:message-list", kwargs={"pk": conversation.pk})
    limit = ctxsum_settings.MAX_BODY_BYTES
    body = json.dumps({"role": "user", "content": "x" * limit})  # 3 MB: over 2.5 MiB
    response = api.generic("POST", url, body, content_type="application/json")
    detail = assert_json_error(response, 413, "too_large")["detail"]
    assert str(len(body)) in detail and str(limit) in detail
