"""docs/api.md, written from real requests.

``generate()`` sets up what ``make run`` sets up (``ctxsum_demo``: the demo user, its token
and the sample conversation), then makes every request the page documents, in the page's
order, through Django's test client: the project's URLconf, middleware, token
authentication and parsers, as a request from curl meets them, with the bytes of the body
the page shows. Not a live server: no port and no server thread, and the test suite can run
it on its own test database; the quickstart's curl walkthrough (docs/quickstart.md) is the
one run against a live server (tests/test_api_docs.py).

The page shows each request as the curl command that sends the same method, path, headers
and body, and what the server answered, shortened and with ids and times replaced (see
``render``), so the same requests write the same page. The prose sits beside the requests
(``compaction``, ``history``, ``errors``), takes its numbers from the answers, and stops the
page (``expect``) when an answer no longer says what the prose claims.

``manage.py ctxsum_api_docs`` runs it on a new, empty database and writes the page; the
test suite runs it on its own and compares.
"""

from __future__ import annotations

import json
import tempfile
from io import StringIO
from typing import Any

import django
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import override_settings
from rest_framework.authtoken.models import Token

from ctxsum.conf import ctxsum_settings
from project.api_docs import compaction, errors, facts, history, schema
from project.api_docs.document import OTHER_USER, READER, Document

# The example project's development defaults, whatever the environment says: the offline
# summarizer (no network, the same summary every time) and the models `make run` uses.
# AUTO_COMPACT is off, so each compaction the page shows is its own request; the section
# on automatic compaction turns it on (history.auto_compact).
CTXSUM = {
    "SUMMARIZER": "ctxsum.summarizers.offline.OfflineSummarizer",
    "SUMMARY_MODEL": "gpt-4o-mini",
    "DEFAULT_MODEL": "gpt-4o",
    "AUTO_COMPACT": False,
    # The page's conversations are a few short messages, which no compaction pays back:
    # they compact whenever due and keep all of KEEP (the default lands at half the
    # trigger), so that the page shows a compaction at every step that reaches the trigger.
    "REQUIRE_PAYOFF": False,
    "LANDING": "keep",
}
# Queued compactions wait in the dummy task backend, never run: every page is the same.
TASKS_MODULE = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
TASKS = {"default": {"BACKEND": f"{TASKS_MODULE}.backends.dummy.DummyBackend"}}
# JSON for an unknown URL (DEBUG shows Django's page instead), `make run`'s host.
SETTINGS: dict[str, Any] = {
    "CTXSUM": CTXSUM,
    "TASKS": TASKS,
    "DEBUG": False,
    "ALLOWED_HOSTS": ["127.0.0.1"],
}


def generate() -> str:
    """The text of docs/api.md. Needs an empty database: it creates users and
    conversations."""
    with override_settings(**SETTINGS):
        document = Document(reader=READER, tokens=_users())
        listed = document.call("GET", "/conversations/")
        document.name("CONV", listed.data["results"][0]["id"])
        _introduction(document)
        for section in (
            *compaction.SECTIONS,
            *history.SECTIONS,
            *facts.SECTIONS,
            *errors.SECTIONS,
            *schema.SECTIONS,
        ):
            section(document)
        return document.markdown()


def _users() -> dict[str, str]:
    """What ``make run`` sets up, and a second user: user name -> API token."""
    with tempfile.TemporaryDirectory() as no_data:
        call_command("ctxsum_demo", username=READER, data_dir=no_data, stdout=StringIO())
    manager = get_user_model()._default_manager
    other = manager.create_user(**{get_user_model().USERNAME_FIELD: OTHER_USER})
    Token.objects.create(user=other)
    return {
        token.user.get_username(): token.key
        for token in Token.objects.select_related("user").order_by("created")
    }


def _introduction(document: Document) -> None:
    trigger, keep = json.dumps(ctxsum_settings.TRIGGER), json.dumps(ctxsum_settings.KEEP)
    document.text(
        f"""
        # The REST API by example

        Requests against the example project (`make run`) with the offline summarizer and
        the default policy (`TRIGGER {trigger}`, `KEEP {keep}`), on the sample
        conversation that `ctxsum_demo` loads. This page is written by `make docs`
        (`python manage.py ctxsum_api_docs`), which makes these requests in this order on a
        new database and records what they answer; the test suite fails when the page and
        the answers differ. Answers are shortened where marked `…`; ids show as the
        variable that holds them (`$CONV`) and times as `<time>`. Requests whose body is too
        long to show are described instead. [The REST API guide](guide/rest-api.md)
        describes every field.

        ```sh
        export TOKEN=…                       # printed by make run
        export CONV=…                        # the sample conversation's id, printed too
        export API=http://127.0.0.1:8000/api
        auth=(-H "Authorization: Token $TOKEN")
        json=(-H "Content-Type: application/json")
        ```
        """
    )
