"""Settings of ``bench.background``: the example project's, with background compaction on
(``COMPACTION_RUNNER = "tasks"``, the django-tasks database backend that ``manage.py
db_worker`` runs) and the slow summarizer of bench/slow_summarizer.py. The benchmark and its
workers all use this module (``DJANGO_SETTINGS_MODULE=bench.background_settings``) with the
same environment: ``DATABASE_URL``, and ``CTXSUM_BENCH_SUMMARY_SECONDS`` for the summarizer's
wait.
"""

from __future__ import annotations

import os

from project.settings import *  # noqa: F403
from project.settings import CTXSUM

DEBUG = False
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
CTXSUM = {
    **CTXSUM,
    "SUMMARIZER": "bench.slow_summarizer.SlowSummarizer",
    "SUMMARIZER_OPTIONS": {"seconds": float(os.environ.get("CTXSUM_BENCH_SUMMARY_SECONDS", "10"))},
    "ENCODING": "o200k_base",
    "AUTO_COMPACT": True,
    "COMPACTION_RUNNER": "tasks",
}
