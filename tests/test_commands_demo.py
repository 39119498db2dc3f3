"""ctxsum_demo: a user whose printed password and token work, the sample conversation loaded
once, and the data folder imported through ctxsum_import, however often it runs."""

from __future__ import annotations

import json
import re
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import authenticate
from django.core.management import call_command
from rest_framework.test import APIClient

from ctxsum.models import Conversation
from ctxsum.selectors import transcript_list
from tests.factories import assistant_message, user_message, write_jsonl
from tests.support.urls import api_url

SAMPLE = Path(settings.BASE_DIR) / "project" / "sample_conversation.json"


def run_demo(data_dir: Path, **options) -> tuple[str, str, str]:
    """Run the command; return its output, the printed password and the printed token."""
    out = StringIO()
    call_command("ctxsum_demo", data_dir=str(data_dir), stdout=out, stderr=StringIO(), **options)
    output = out.getvalue()
    password = re.search(r"^  password: (\S+)$", output, re.M)
    token = re.search(r"^  API token: ([0-9a-f]{40})", output, re.M)
    assert password and token, output
    return output, password.group(1), token.group(1)


def token_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.mark.django_db
def test_demo_sets_up_a_user_whose_password_and_token_work(tmp_path, django_user_model):
    output, password, token = run_demo(tmp_path)

    demo = django_user_model.objects.get(username="demo")
    assert demo.is_staff
    assert authenticate(username="demo", password=password) == demo
    response = token_client(token).get(api_url("conversation-list"))
    assert response.status_code == 200, response.content
    (listed,) = response.json()["results"]
    assert listed["title"] == "Lisbon trip: rebooking a cancelled flight"
    conversation = Conversation.objects.get(owner=demo)
    sample = json.loads(SAMPLE.read_text(encoding="utf-8"))
    transcript = [row.as_openai() for row in transcript_list(conversation=conversation)]
    assert transcript == sample["messages"]
    assert len(transcript) == 16
    assert f"export TOKEN={token}" in output
    # Text the command prints for a person to paste, not a request: the literal URL stays.
    assert 'curl -H "Authorization: Token $TOKEN" http://127.0.0.1:8000/api/conversations/' in (
        output
    )
    assert f"No *.jsonl.gz files in {tmp_path}" in output


@pytest.mark.django_db
def test_demo_is_idempotent_and_renews_only_the_password(tmp_path, django_user_model):
    _, first_password, first_token = run_demo(tmp_path)

    output, password, token = run_demo(tmp_path)

    assert "Sample conversation already loaded" in output
    assert Conversation.objects.count() == 1
    assert django_user_model.objects.filter(username="demo").count() == 1
    assert token == first_token
    assert password != first_password
    assert authenticate(username="demo", password=first_password) is None
    assert authenticate(username="demo", password=password) is not None


@pytest.mark.django_db
def test_demo_imports_the_data_folder_once(tmp_path):
    conversation = {
        "id": "data-1",
        "source": "tests",
        "license": "MIT",
        "valid": True,
        "meta": {},
        "messages": [user_message("Hello"), assistant_message("Hi! How can I help?")],
    }
    write_jsonl(tmp_path / "chats.jsonl.gz", [conversation])

    output, _, _ = run_demo(tmp_path, username="operator")
    again, _, _ = run_demo(tmp_path, username="operator")

    assert "1 conversations, 2 messages imported; 0 rejected; 0 skipped" in output
    assert "0 conversations, 0 messages imported; 0 rejected; 1 skipped" in again
    assert sorted(Conversation.objects.values_list("owner__username", "title")) == [
        ("operator", "Hello"),
        ("operator", "Lisbon trip: rebooking a cancelled flight"),
    ]


@pytest.mark.django_db
def test_demo_reuses_an_existing_user_without_making_it_staff(tmp_path, user):
    output, password, _ = run_demo(tmp_path, username=user.username)

    user.refresh_from_db()
    assert "Reusing the demo user 'alice'" in output
    assert not user.is_staff
    assert user.check_password(password)
