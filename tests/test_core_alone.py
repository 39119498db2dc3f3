"""A project with "ctxsum" alone, without the optional apps "ctxsum.facts" and "ctxsum.chat": it
migrates a new database with neither app's tables, serves the REST API without their routes,
compacts without asking the summarizer for key facts, rebuilds, reverts and redacts, renders
the admin's review pages without the facts' panels, and never imports either app.

The project runs in a subprocess (INSTALLED_APPS is read once, and the test database of the
suite has the app's tables): a small settings module, a fresh SQLite file, the offline
summarizer, and a script that drives it and prints what it saw."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.processes import script_report
from tests.support.shared import REPO_ROOT

SETTINGS = """
SECRET_KEY = "ctxsum-core-alone"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "drf_spectacular",
    "ctxsum",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "core_alone_urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": DATABASE}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "static/"
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
CTXSUM = {"SUMMARIZER": "ctxsum.summarizers.offline.OfflineSummarizer", "AUTO_COMPACT": False}
"""

URLS = """
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/", include("ctxsum.api.urls")),
]
"""

SCRIPT = """
import json
import sys

import django

django.setup()

from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import NoReverseMatch, reverse

from ctxsum.models import Summary
from ctxsum.services.summaries import summary_prompt
from ctxsum.summarizers.offline import OfflineSummarizer
from ctxsum.summarizers.openai import OpenAISummarizer

answers = []
answer = OfflineSummarizer.answer


def recorded(self, **kwargs):
    answers.append(answer(self, **kwargs))
    return answers[-1]


OfflineSummarizer.answer = recorded

seen = {"installed": [app for app in ("ctxsum.facts", "ctxsum.chat") if apps.is_installed(app)]}
call_command("migrate", verbosity=0)
seen["app_tables"] = [
    t for t in connection.introspection.table_names() if "fact" in t or "chat" in t
]

user = get_user_model().objects.create_superuser("admin", "admin@example.com", "password")
client = Client()
client.force_login(user)

messages = [
    {"role": "user", "content": f"Order AI-{n}01 ships to ana{n}@example.com on 2025-03-0{n}."}
    for n in range(1, 8)
]
body = {"messages": messages, "policy": {"keep": {"messages": 2}}}
created = client.post("/api/conversations/", body, "application/json")
seen["created"] = created.status_code
pk = created.json()["id"]
seen["facts_tokens"] = created.json()["facts_tokens"]
try:
    reverse("ctxsum:fact-list", kwargs={"pk": pk})
    seen["fact_route"] = True
except NoReverseMatch:
    seen["fact_route"] = False
seen["facts_get"] = client.get(f"/api/conversations/{pk}/facts/").status_code
chat = client.post(f"/api/conversations/{pk}/chat/", {"message": None}, "application/json")
seen["chat_post"] = chat.status_code
seen["subject_facts_get"] = client.get("/api/subjects/someone/facts/").status_code
schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
seen["schema_paths"] = sorted(json.loads(schema.content)["paths"])

compacted = client.post(f"/api/conversations/{pk}/compact/", {"force": True}, "application/json")
seen["compacted"] = compacted.json().get("compacted")
summary = Summary.objects.filter(conversation_id=pk).latest("version")
seen["facts_skipped"] = summary.facts_skipped
seen["calls"] = len(answers)
seen["proposed"] = [fact.key for call in answers for fact in call.facts]
openai = OpenAISummarizer(model="gpt-4o-mini", timeout=5.0, max_tokens=500)
seen["instruction"] = openai.facts_instruction()
seen["prompt_asks_facts"] = "facts" in summary_prompt(200, openai.facts_instruction())

review = client.get(reverse("admin:ctxsum_conversation_review", args=[pk]))
seen["review"] = review.status_code
seen["review_has_facts"] = 'id="facts"' in review.content.decode()
seen["review_has_context"] = 'id="context"' in review.content.decode()
page = client.get(reverse("admin:ctxsum_summary_change", args=[summary.pk]))
seen["summary_page"] = page.status_code
seen["summary_page_has_facts"] = 'id="facts"' in page.content.decode()
seen["delete_page"] = client.get(reverse("admin:ctxsum_conversation_delete", args=[pk])).status_code

rebuilt = client.post(f"/api/conversations/{pk}/summaries/rebuild/", {}, "application/json")
seen["rebuilt"] = rebuilt.json().get("rebuilt")
version = rebuilt.json()["summary"]["version"]
reverted = client.post(
    f"/api/conversations/{pk}/summaries/{version}/revert/", {}, "application/json"
)
seen["reverted"] = reverted.json().get("reverted")
redacted = client.post(f"/api/conversations/{pk}/messages/1/redact/", {}, "application/json")
seen["redacted"] = redacted.status_code
seen["stats"] = sorted(client.get(f"/api/conversations/{pk}/").json()["stats"])
seen["app_modules"] = sorted(
    name for name in sys.modules if name.startswith(("ctxsum.facts", "ctxsum.chat"))
)
print(json.dumps(seen))
"""


def run_core_alone(tmp_path: Path) -> dict:
    (tmp_path / "core_alone_settings.py").write_text(
        f"DATABASE = {str(tmp_path / 'db.sqlite3')!r}\n" + SETTINGS
    )
    (tmp_path / "core_alone_urls.py").write_text(URLS)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "core_alone_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)]),
    }
    env.pop("DATABASE_URL", None)
    return script_report(SCRIPT, cwd=tmp_path, env=env, timeout=300)


def test_a_project_with_ctxsum_alone(tmp_path):
    seen = run_core_alone(tmp_path)
    assert seen["installed"] == []
    assert seen["app_tables"] == []
    assert seen["app_modules"] == []
    # The API: the core's routes, none of the facts'; the conversation's answer keeps its
    # facts_tokens (0: no block is contributed).
    assert seen["created"] == 201
    assert seen["facts_tokens"] == 0
    assert not seen["fact_route"]
    assert seen["facts_get"] == 404
    assert seen["subject_facts_get"] == 404
    assert seen["schema_paths"]
    assert not [path for path in seen["schema_paths"] if "facts" in path or "chat" in path]
    assert seen["chat_post"] == 404
    # The compaction: a summary, and no word of key facts asked for or skipped.
    assert seen["compacted"] is True
    assert seen["calls"] >= 1
    assert seen["proposed"] == []
    assert seen["facts_skipped"] == ""
    assert seen["instruction"] == ""
    assert not seen["prompt_asks_facts"]
    # The review pages render, without the facts' panels.
    assert seen["review"] == 200
    assert seen["review_has_context"]
    assert not seen["review_has_facts"]
    assert seen["summary_page"] == 200
    assert not seen["summary_page_has_facts"]
    assert seen["delete_page"] == 200
    # A rebuild, the revert of what it wrote and a redaction, through the API.
    assert seen["rebuilt"] is True
    assert seen["reverted"] is True
    assert seen["redacted"] == 200
    assert not {"chat_turns", "prompt_tokens", "completion_tokens"} & set(seen["stats"])
