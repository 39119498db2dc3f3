"""The example project's settings without the optional app ``ctxsum.chat``, on the SQLite
database that ``CTXSUM_TEST_DB`` names: what tests/test_without_chat.py runs a project
that does not want the chat turn with."""

from __future__ import annotations

import os

from ctxsum.conf import DEFAULTS
from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS
from tests.suite_defaults import SUITE_DEFAULTS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "ctxsum.chat"]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["CTXSUM_TEST_DB"]}
}
CTXSUM = {"SUMMARIZER": "ctxsum.summarizers.offline.OfflineSummarizer", "AUTO_COMPACT": False}
# The suite's two defaults, as tests/settings.py applies them.
DEFAULTS.update(SUITE_DEFAULTS)
