from __future__ import annotations

import pytest

from tests import profiles
from tests.support.shared import use_tiktoken_cache

# tiktoken downloads its encodings on first use: use the offline cache when there is one.
use_tiktoken_cache()
# The Hypothesis profile (dev or ci, tests/profiles.py), loaded before any test module
# builds its settings from it.
PROFILE = profiles.load()


def pytest_report_header() -> str:
    return f"ctxsum test profile: {PROFILE} (set by {profiles.VARIABLE}: dev or ci)"


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    # Creating a user hashes a password; the default hasher costs most of a second each.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _ctxsum_defaults(request, monkeypatch):
    """ctxsum's own defaults for a test marked ``ctxsum_defaults``, in place of the suite's
    (tests/suite_defaults.py)."""
    if not request.node.get_closest_marker("ctxsum_defaults"):
        yield
        return
    from ctxsum.conf import DEFAULTS, Defaults, ctxsum_settings
    from tests.suite_defaults import SUITE_DEFAULTS

    for key in SUITE_DEFAULTS:
        monkeypatch.setitem(DEFAULTS, key, getattr(Defaults, key))
    ctxsum_settings.reload()
    yield
    monkeypatch.undo()
    ctxsum_settings.reload()


@pytest.fixture
def assert_queries_at_most(django_assert_max_num_queries):
    """``with assert_queries_at_most(budget.APPEND):`` fails, listing the queries, when the
    block takes more than its budget (tests/query_budgets.py holds every budget)."""
    return django_assert_max_num_queries


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user(username="alice", password="pw-alice")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user(username="mallory", password="pw-mallory")


@pytest.fixture
def api(user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def other_api(other_user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(other_user)
    return client


@pytest.fixture
def offline_summarizer(settings):
    """CTXSUM with the offline summarizer, whatever the environment says."""
    from tests.factories import OFFLINE_SUMMARIZER

    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}


@pytest.fixture
def openai_server(monkeypatch):
    """A running OpenAI-compatible server on 127.0.0.1 (see tests/openai_server.py)."""
    from tests.openai_server import running_fake_openai

    with running_fake_openai(monkeypatch) as server:
        yield server


@pytest.fixture
def model_server(monkeypatch):
    """An agent framework's model (tests/test_integration_*.py): a second local server
    beside the summarizer's ``openai_server``."""
    from tests.openai_server import running_fake_openai

    with running_fake_openai(monkeypatch) as server:
        yield server


@pytest.fixture
def openai_summarizer(openai_server, settings):
    """CTXSUM pointed at the local server through the real openai backend."""
    settings.CTXSUM = {
        **getattr(settings, "CTXSUM", {}),
        "SUMMARIZER": "ctxsum.summarizers.openai.OpenAISummarizer",
        "SUMMARIZER_OPTIONS": {"base_url": openai_server.base_url, "api_key": "test-key"},
        "SUMMARY_MODEL": "summary-model-1",
        "SUMMARY_TIMEOUT": 1,
    }
    return openai_server


@pytest.fixture
def compacting(openai_summarizer, settings):
    """Automatic compaction in the appending process (COMPACTION_RUNNER "sync"), summarized
    by the local server."""
    settings.CTXSUM = {**settings.CTXSUM, "AUTO_COMPACT": True, "COMPACTION_RUNNER": "sync"}
    return openai_summarizer


@pytest.fixture
def chat_model(openai_summarizer, settings):
    """CTXSUM's chat model and its summarizer both pointed at one local server (the
    summarizer through the real openai backend, as ``openai_summarizer``); no backoff, so
    retries cost no time. The chat requests name ``gpt-4o``, the summarizer's
    ``summary-model-1``."""
    settings.CTXSUM = {
        **settings.CTXSUM,
        "DEFAULT_MODEL": "gpt-4o",
        "CHAT_OPTIONS": {"base_url": openai_summarizer.base_url, "api_key": "chat-key"},
        "CHAT_TIMEOUT": 5,
        "CHAT_RETRY_BACKOFF": 0,
    }
    return openai_summarizer
