"""The Django settings of the Celery processes tests/test_celery_worker.py starts (its
workers and the processes that append): tests/settings_worker.py's, with Celery's settings
(read by tests/celery_app.py, namespace ``CELERY``) from the environment the test sets: the
Redis broker, transport options of the test's own (a key prefix no other run shares, the
visibility timeout) and the queue."""

from __future__ import annotations

import json
import os

from tests.settings_worker import *  # noqa: F403

CELERY_BROKER_URL = os.environ["CTXSUM_TEST_CELERY_BROKER"]
CELERY_BROKER_TRANSPORT_OPTIONS = json.loads(os.environ["CTXSUM_TEST_CELERY_TRANSPORT"])
CELERY_TASK_DEFAULT_QUEUE = os.environ["CTXSUM_TEST_CELERY_QUEUE"]
# ctxsum's task returns its answer for the log; nothing reads a result.
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
