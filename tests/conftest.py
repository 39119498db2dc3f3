from __future__ import annotations

import os
from pathlib import Path

import pytest

# tiktoken downloads its encodings on first use; use the shared offline cache when there is
# one and nothing else was configured.
_SHARED_TIKTOKEN = Path(__file__).resolve().parents[2] / "shared" / "tiktoken"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _SHARED_TIKTOKEN.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_SHARED_TIKTOKEN)


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
