"""ctxsum's routes answer JSON errors in a project that installs none of ctxsum's error
handlers and has an exception handler of its own; their last route, the JSON 404, takes
no URL of the project's (tests/support/new_project_urls.py, tests/support/root_urls.py)."""

from __future__ import annotations

import pytest
from django.test import Client

from ctxsum.services import conversation_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def new_project(settings):
    settings.ROOT_URLCONF = "tests.support.new_project_urls"
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "EXCEPTION_HANDLER": "tests.support.new_project_urls.no_handler",
    }


@pytest.fixture
def client(user):
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def conversation(user):
    return conversation_create(owner=user, messages=[{"role": "user", "content": "Hello"}])


def json_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json", response.content[:200]
    body = response.json()
    assert body["code"] == code and body["detail"], body
    return body


@pytest.mark.parametrize(
    "path",
    [
        "/api/conversations/{pk}/no-such-thing/",
        "/api/conversations/{pk}/messages/0/nothing/",
        "/api/conversations/not-an-id/",
        "/api/subjects/",
    ],
)
def test_an_unknown_url_under_ctxsums_routes_is_a_json_404(new_project, client, conversation, path):
    json_error(client.get(path.format(pk=conversation.pk)), 404, "not_found")


def test_a_bad_body_is_a_json_400_with_its_codes_whatever_the_projects_handler(
    new_project, client, conversation
):
    url = f"/api/conversations/{conversation.pk}/messages/"
    body = json_error(client.post(url, {"role": "robot"}, "application/json"), 400, "invalid")
    assert body["errors"] == [
        {
            "field": "role",
            "code": "invalid_choice",
            "detail": "Must be one of: system, developer, user, assistant, tool.",
        }
    ]
    json_error(client.post(url, "{", "application/json"), 400, "parse_error")
    json_error(client.delete("/api/conversations/"), 405, "method_not_allowed")
    assert conversation.messages.count() == 1


@pytest.mark.parametrize("method", ["post", "patch", "delete"])
def test_a_write_to_an_unknown_url_with_a_session_and_no_csrf_token_is_a_json_404(
    new_project, user, conversation, method
):
    # A logged-in browser's session cookie, no CSRF token: Django's CSRF check would answer
    # its HTML 403 page before the 404 (an empty subject, found by the fuzzing).
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    for path in ("/api/subjects/facts/56/", f"/api/conversations/{conversation.pk}/nothing/"):
        send = getattr(client, method)
        json_error(send(path, {"value": "x"}, "application/json"), 404, "not_found")


def test_a_url_without_its_slash_is_redirected_or_named(new_project, client, conversation):
    url = f"/api/conversations/{conversation.pk}/messages"
    response = client.get(url)
    assert response.status_code == 301 and response["Location"] == f"{url}/"
    body = json_error(client.post(url, {"role": "user"}, "application/json"), 404, "not_found")
    assert f"{url}/" in body["detail"]
    assert conversation.messages.count() == 1


def test_the_projects_routes_under_the_same_prefix_are_still_answered(new_project, client):
    assert client.get("/api/own/").json() == {"own": "/api/own/"}
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200 and "/api/conversations/" in schema.json()["paths"]
    # Under the prefix but outside ctxsum's routes: the project's own 404 (its handlers).
    assert client.get("/api/nothing-here/").status_code == 404


def test_mounted_at_the_root_it_takes_no_route_of_the_projects(settings, client, conversation):
    settings.ROOT_URLCONF = "tests.support.root_urls"
    assert client.get("/own/").json() == {"own": "/own/"}
    assert client.get("/admin/").status_code in (200, 302)
    assert client.get(f"/conversations/{conversation.pk}/").json()["id"] == str(conversation.pk)
    json_error(client.get(f"/conversations/{conversation.pk}/nothing/"), 404, "not_found")
