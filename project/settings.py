"""Settings of the ctxsum example project, read from the environment with django-environ.

Every variable has a development default, so the project runs with no setup on SQLite.
"""

from __future__ import annotations

import os
from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent
# The compaction trigger of the demo, in tokens of active context (CTXSUM_TRIGGER_TOKENS).
DEMO_TRIGGER_TOKENS = 1000

env = environ.Env(
    DEBUG=(bool, True),
    ALLOWED_HOSTS=(list, ["127.0.0.1", "localhost", "testserver"]),
    CTXSUM_SUMMARY_TIMEOUT=(float, 60.0),
    # Unset: the lease lasts one summarizer call (CTXSUM_SUMMARY_TIMEOUT + 5 s).
    CTXSUM_LEASE_SECONDS=(float, None),
    # Comma-separated models the chat turn falls back to, in order.
    CTXSUM_CHAT_FALLBACK_MODELS=(list, []),
    # A trigger suited to a demo (ctxsum's own default is 12,000 tokens): a chat of short
    # questions answered by the stand-in model compacts within 20 turns
    # (tests/test_demo_trigger.py), one with a real model's longer replies sooner.
    CTXSUM_TRIGGER_TOKENS=(int, DEMO_TRIGGER_TOKENS),
)
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")

SECRET_KEY = env("SECRET_KEY", default="django-insecure-ctxsum-example-project-only")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served locally
    # Django's tasks framework: built in from Django 6.0, the django-tasks backport before
    # it; django_tasks_db stores the tasks in the database for `manage.py db_worker`.
    *(["django_tasks"] if django.VERSION < (6, 0) else []),
    "django_tasks_db",
    "ctxsum",
    "ctxsum.facts",  # optional: key facts beside the summary
    "ctxsum.chat",  # optional: the chat turn (POST …/chat/)
    # The example project's own commands: ctxsum_demo, ctxsum_api_docs.
    "project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The task worker writes beside the web server. Each transaction takes SQLite's write
    # lock as it begins, waiting up to 20 seconds for it: two writers then queue, where
    # two that each began by reading would have one fail with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20}
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# The chat page asks for a login through the browsable API's login page.
LOGIN_URL = "rest_framework:login"

# Errors reach the console with their tracebacks: Django's (django.request: every 500) and
# ctxsum's own (ctxsum.api: an unexpected exception in a view; ctxsum.compaction: failed
# compactions). CTXSUM_LOG_LEVEL sets ctxsum's level.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django.request": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        "ctxsum": {
            "handlers": ["console"],
            "level": env("CTXSUM_LOG_LEVEL", default="INFO"),
            "propagate": False,
        },
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "ctxsum",
    "DESCRIPTION": "Conversations stored in Django and compacted by versioned LLM summaries.",
    "VERSION": "0.1.0",
    # 3.1: its schemas are JSON Schema, so null is spelled as such (ctxsum describes 3.0 too).
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from the drf-spectacular-sidecar package: the docs page needs no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

# Background compaction: tasks in the project's database, run by `manage.py db_worker`
# (`make run` starts one beside the web server).
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
# That worker runs beside every server this project documents, so the warning that the
# backend needs one (ctxsum.W008) is silenced.
SILENCED_SYSTEM_CHECKS = ["ctxsum.W008"]

# The openai package reads OPENAI_API_KEY and OPENAI_BASE_URL itself.
_has_openai = bool(os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"))
_SUMMARIZERS = {
    "openai": "ctxsum.summarizers.openai.OpenAISummarizer",
    "offline": "ctxsum.summarizers.offline.OfflineSummarizer",
}
_summarizer = env("CTXSUM_SUMMARIZER", default="openai" if _has_openai else "offline")

CTXSUM = {
    "SUMMARIZER": _SUMMARIZERS.get(_summarizer, _summarizer),
    "SUMMARY_MODEL": env("CTXSUM_SUMMARY_MODEL", default="gpt-4o-mini"),
    "TRIGGER": {"tokens": env("CTXSUM_TRIGGER_TOKENS")},
    # The chat turn's primary model (a conversation's own model comes first).
    "DEFAULT_MODEL": env("CTXSUM_CHAT_MODEL", default="gpt-4o"),
    "CHAT_FALLBACK_MODELS": env("CTXSUM_CHAT_FALLBACK_MODELS"),
    "SUMMARY_TIMEOUT": env("CTXSUM_SUMMARY_TIMEOUT"),
    "LEASE_SECONDS": env("CTXSUM_LEASE_SECONDS"),
    # "tasks": the task worker `make run` starts compacts; "sync": the appending process
    # does, right after the append (the scripts of examples/, which run no worker).
    "COMPACTION_RUNNER": env("CTXSUM_COMPACTION_RUNNER", default="tasks"),
}
# With no OpenAI-compatible server, the chat turn talks to the project's own stand-in
# (project/offline_model.py) at this address: the chat page works right after `make run`.
OFFLINE_CHAT_MODEL = not _has_openai
if OFFLINE_CHAT_MODEL:
    CTXSUM["CHAT_OPTIONS"] = {
        "base_url": env(
            "CTXSUM_OFFLINE_MODEL_URL", default="http://127.0.0.1:8000/offline-model/v1"
        ),
        "api_key": "offline",
    }
