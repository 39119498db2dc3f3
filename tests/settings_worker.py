"""The example project's settings for the task workers tests start (tests/test_killed_worker.py):
the project's own, with the suite's defaults (tests/settings.py, ``SUITE_DEFAULTS``), so that
the small conversations of those tests compact when due."""

from __future__ import annotations

from ctxsum.conf import DEFAULTS
from project.settings import *  # noqa: F403
from tests.suite_defaults import SUITE_DEFAULTS

DEFAULTS.update(SUITE_DEFAULTS)
