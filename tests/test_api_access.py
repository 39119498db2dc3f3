"""API_CONVERSATIONS and API_PERMISSION_CLASSES: the examples of docs/how-to/permissions.md,
run as written, decide who reaches which conversation, and bad values are system errors."""

from __future__ import annotations

import re
import sys
import types

import pytest
from django.contrib.auth.models import Group
from django.core.checks import run_checks

from ctxsum.services import conversation_create
from tests.support.shared import REPO_ROOT
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

PAGE = REPO_ROOT / "docs" / "how-to" / "permissions.md"
MODULE = "myproject_access_from_the_docs"


@pytest.fixture(scope="module", autouse=True)
def documented_access():
    """The page's first Python block, as the module its settings name."""
    text = PAGE.read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    module = types.ModuleType(MODULE)
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
    sys.modules[MODULE] = module
    yield module
    del sys.modules[MODULE]


@pytest.fixture
def staff_read_all(settings):
    settings.CTXSUM = {
        **settings.CTXSUM,
        "API_CONVERSATIONS": f"{MODULE}.staff_see_all",
        "API_PERMISSION_CLASSES": [
            "rest_framework.permissions.IsAuthenticated",
            f"{MODULE}.OwnerOrStaffReadOnly",
        ],
    }


@pytest.fixture
def people(django_user_model):
    return {
        name: django_user_model.objects.create_user(name, is_staff=name == "staff")
        for name in ("owner", "staff", "other")
    }


@pytest.fixture
def conversation(people):
    return conversation_create(
        owner=people["owner"], messages=[{"role": "user", "content": "My order is late."}]
    )


def client_of(user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client


def listed(user) -> list[str]:
    return [
        row["id"] for row in client_of(user).get(api_url("conversation-list")).json()["results"]
    ]


def append(user, conversation):
    message = {"role": "user", "content": "Any news?"}
    return client_of(user).post(api_url("message-list", conversation), message, format="json")


def test_by_default_only_the_owner_reaches_a_conversation(people, conversation):
    assert client_of(people["staff"]).get(api_url("context", conversation)).status_code == 404
    assert listed(people["staff"]) == []
    assert append(people["owner"], conversation).status_code == 201


def test_staff_read_every_conversation_and_change_only_their_own(
    staff_read_all, people, conversation
):
    staff = client_of(people["staff"])
    assert listed(people["staff"]) == [str(conversation.pk)]
    context = staff.get(api_url("context", conversation))
    assert context.status_code == 200
    assert context.json()["messages"][-1]["content"] == "My order is late."
    refused = append(people["staff"], conversation)
    assert refused.status_code == 403 and refused.json()["code"] == "permission_denied"
    assert conversation.messages.count() == 1
    # Everyone else as before: their own only; the owner changes theirs.
    assert client_of(people["other"]).get(api_url("context", conversation)).status_code == 404
    assert listed(people["other"]) == []
    assert append(people["owner"], conversation).status_code == 201
    # A conversation staff create is their own, and theirs to change.
    created = staff.post(api_url("conversation-list"), {"title": "Mine"}, format="json")
    assert created.status_code == 201
    assert append(people["staff"], created.json()["id"]).status_code == 201


def test_an_organisation_reaches_its_members_conversations(settings, people, conversation):
    settings.CTXSUM = {**settings.CTXSUM, "API_CONVERSATIONS": f"{MODULE}.same_organisation"}
    organisation = Group.objects.create(name="Acme")
    organisation.user_set.add(people["owner"], people["other"])
    assert listed(people["other"]) == [str(conversation.pk)]
    assert append(people["other"], conversation).status_code == 201
    assert listed(people["staff"]) == []
    assert append(people["staff"], conversation).status_code == 404
    assert conversation.messages.count() == 2


@pytest.mark.parametrize(
    ("settings_given", "words"),
    [
        ({"API_PERMISSION_CLASSES": "rest_framework.permissions.IsAdminUser"}, "a list"),
        ({"API_PERMISSION_CLASSES": ["no.such.Permission"]}, "cannot be imported"),
        ({"API_PERMISSION_CLASSES": ["ctxsum.models.Conversation"]}, "not a permission"),
        ({"API_CONVERSATIONS": "no.such.function"}, "cannot be imported"),
        ({"API_CONVERSATIONS": "ctxsum.conf.DEFAULT_PROMPT"}, "is not callable"),
    ],
)
def test_a_bad_access_setting_is_a_system_error(settings, settings_given, words):
    settings.CTXSUM = {**settings.CTXSUM, **settings_given}
    found = [m for m in run_checks() if m.id == "ctxsum.E015"]
    assert len(found) == 1 and words in found[0].msg, found


def test_the_default_access_settings_pass_the_checks():
    assert not [m for m in run_checks() if m.id == "ctxsum.E015"]
