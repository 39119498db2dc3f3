"""The test suite's settings: the example project's, plus a second database alias,
``other``, which the multi-database tests route ctxsum to (tests/test_multi_db.py). Tests
that do not ask for it never touch it, and its test database is made only when one does.

Automatic compaction is off unless a test turns it on, and the task backend is the dummy
one: a compaction task a test enqueues waits there, unrun, unless the test runs it (or
switches to the immediate backend, tests/test_tasks.py)."""

from __future__ import annotations

import django

from ctxsum.conf import DEFAULTS
from project.settings import *  # noqa: F403
from project.settings import CTXSUM, DATABASES
from tests.suite_defaults import SUITE_DEFAULTS

_default = DATABASES["default"]
if _default["ENGINE"].endswith("sqlite3"):
    _other = {**_default, "NAME": f"{_default['NAME']}.other"}
else:
    _other = {**_default, "TEST": {"NAME": f"test_{_default['NAME']}_other"}}
DATABASES = {"default": _default, "other": _other}

CTXSUM = {**CTXSUM, "AUTO_COMPACT": False}
# The suite's two defaults (tests/suite_defaults.py), whatever CTXSUM dict a test sets.
DEFAULTS.update(SUITE_DEFAULTS)
# The tasks framework: django.tasks from Django 6.0, the django_tasks backport before it.
TASKS_MODULE = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
TASKS = {"default": {"BACKEND": f"{TASKS_MODULE}.backends.dummy.DummyBackend"}}
