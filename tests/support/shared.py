"""Where the tests' material lives: ``../shared/tiktoken`` beside the checkout (tiktoken's
encoding files, for machines that cannot download them), ``../shared/data`` beside it (the
full data set of real conversations the full replay and one import test read) and
``tests/fixtures`` inside it (a small sample of those conversations, shipped with the
tests)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DIR = REPO_ROOT.parent / "shared"
DATA_DIR = SHARED_DIR / "data"
DATA_FILES = ("agent_trajectories.jsonl.gz", "long_chats.jsonl.gz")
TIKTOKEN_DIR = SHARED_DIR / "tiktoken"
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"
FIXTURE_CONVERSATIONS = FIXTURES_DIR / "conversations.jsonl"


def use_tiktoken_cache() -> None:
    """Point tiktoken at the offline cache beside the checkout, when there is one and
    ``TIKTOKEN_CACHE_DIR`` is not set already."""
    if "TIKTOKEN_CACHE_DIR" not in os.environ and TIKTOKEN_DIR.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_DIR)


def data_present() -> bool:
    return all((DATA_DIR / name).is_file() for name in DATA_FILES)
