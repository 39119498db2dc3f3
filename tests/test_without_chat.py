"""A project without the optional app ``ctxsum.chat``: it migrates with no chat table,
appends, compacts, rebuilds, reverts and redacts without importing the app; a
conversation's stats have no chat keys, the API has no chat route, and a CHAT_* setting is
reported as ignored (ctxsum.W007). Run in a new process: this one has the app installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import django
django.setup()
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.urls import NoReverseMatch, reverse

call_command("migrate", verbosity=0)
from ctxsum import selectors, services

user = get_user_model().objects.create_user("solo")
turns = [
    {"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} about Lisbon " * 12}
    for n in range(10)
]
conversation = services.conversation_create(
    owner=user, system="Be brief.", messages=turns[:2], trigger={"messages": 6},
    keep={"messages": 2},
)
services.message_append(conversation=conversation, messages=turns[2:])
compacted = services.conversation_compact(conversation=conversation).compacted
rebuilt = services.conversation_rebuild(conversation=conversation).rebuilt
version = selectors.active_summary_version(conversation=conversation)
reverted = services.conversation_revert(conversation=conversation, version=version).reverted
services.message_redact(conversation=conversation, seq=3)
try:
    reverse("ctxsum:chat", kwargs={"pk": conversation.pk})
    chat_route = True
except NoReverseMatch:
    chat_route = False
with override_settings(CTXSUM={"CHAT_TIMEOUT": 5, "AUTO_COMPACT": False}):
    checks = sorted(m.id for m in run_checks() if (m.id or "").startswith("ctxsum."))
print(json.dumps({
    "compacted": compacted,
    "rebuilt": rebuilt,
    "reverted": reverted,
    "stats": sorted(selectors.conversation_stats(conversation=conversation)),
    "tables": sorted(t for t in connection.introspection.table_names() if "chat" in t),
    "chat_modules": sorted(m for m in sys.modules if m.startswith("ctxsum.chat")),
    "chat_route": chat_route,
    "checks": checks,
}))
"""


def test_a_project_without_the_chat_app(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_without_chat",
        "CTXSUM_TEST_DB": str(tmp_path / "solo.sqlite3"),
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert (found["compacted"], found["rebuilt"], found["reverted"]) == (True, True, True)
    assert found["tables"] == []
    assert found["chat_modules"] == []
    assert not found["chat_route"]
    assert not {"chat_turns", "prompt_tokens", "completion_tokens", "cached_tokens"} & set(
        found["stats"]
    )
    assert "message_count" in found["stats"]
    assert found["checks"] == ["ctxsum.W007"]
