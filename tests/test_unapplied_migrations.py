"""A project that installed (or upgraded) ctxsum without running ``migrate``: the API answers
503 with the code ``migrations_unapplied`` and the migrations it lacks, as JSON and logged,
not an opaque 500. Run in a process of its own on a fresh SQLite file, where only Django's
own apps are migrated (the suite's test database has every table)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.processes import script_report
from tests.support.shared import REPO_ROOT

SCRIPT = """
import json, logging, os
os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
import django
django.setup()
from django.core.management import call_command
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

for app in ("contenttypes", "auth", "sessions", "admin"):
    call_command("migrate", app, verbosity=0)
logged = []
class Keep(logging.Handler):
    def emit(self, record):
        logged.append((record.name, record.levelname, record.getMessage()))
logging.getLogger("ctxsum").addHandler(Keep())

user = get_user_model().objects.create_user("newcomer", password="pw")
client = APIClient()
client.force_authenticate(user)
listing = client.get("/api/conversations/")
created = client.post("/api/conversations/", {"title": "Hi"}, format="json")
call_command("migrate", verbosity=0)
after = client.get("/api/conversations/")
print(json.dumps({
    "listing": [listing.status_code, listing.json()],
    "created": [created.status_code, created.json()],
    "after": after.status_code,
    "logged": logged,
}))
"""


def run(tmp_path: Path) -> dict:
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "CTXSUM_SUMMARIZER": "offline",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return script_report(SCRIPT, cwd=REPO_ROOT, env=env, timeout=120)


def test_the_api_says_which_migrations_to_apply(tmp_path):
    seen = run(tmp_path)

    for name in ("listing", "created"):
        status, body = seen[name]
        assert status == 503, body
        assert body["code"] == "migrations_unapplied"
        assert "ctxsum.0001_initial" in body["migrations"]
        assert "python manage.py migrate" in body["detail"]
    # Logged, with what the database said.
    assert any(
        name == "ctxsum.api" and level == "ERROR" and "not applied" in message
        for name, level, message in seen["logged"]
    )
    # Once migrated, the same request works.
    assert seen["after"] == 200
