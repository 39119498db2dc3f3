"""The test suite's settings: the example project's, plus a second database alias,
``other``, which the multi-database tests route ctxsum to (tests/test_multi_db.py). Tests
that do not ask for it never touch it, and its test database is made only when one does."""

from __future__ import annotations

from project.settings import *  # noqa: F403
from project.settings import DATABASES

_default = DATABASES["default"]
if _default["ENGINE"].endswith("sqlite3"):
    _other = {**_default, "NAME": f"{_default['NAME']}.other"}
else:
    _other = {**_default, "TEST": {"NAME": f"test_{_default['NAME']}_other"}}
DATABASES = {"default": _default, "other": _other}
