"""The Celery app of the tests' Celery processes (tests/test_celery_worker.py), as a project
writes its own: Django's settings under the ``CELERY`` namespace, and ctxsum's task module,
``ctxsum.celery_tasks``, discovered by name. ``celery -A tests.celery_app worker`` runs it;
a process that appends imports it first, so that ctxsum's shared task is sent through it."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings_celery")

app = Celery("ctxsum_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["ctxsum"], related_name="celery_tasks")
