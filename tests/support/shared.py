"""Where the material beside a checkout lives: ``../shared/tiktoken`` (tiktoken's encoding
files, for machines that cannot download them) and ``../shared/data`` (the real
conversations the full replay and the import test read)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DIR = REPO_ROOT.parent / "shared"
DATA_DIR = SHARED_DIR / "data"
DATA_FILES = ("agent_trajectories.jsonl.gz", "long_chats.jsonl.gz")
TIKTOKEN_DIR = SHARED_DIR / "tiktoken"


def use_tiktoken_cache() -> None:
    """Point tiktoken at the offline cache beside the checkout, when there is one and
    ``TIKTOKEN_CACHE_DIR`` is not set already."""
    if "TIKTOKEN_CACHE_DIR" not in os.environ and TIKTOKEN_DIR.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_DIR)


def data_present() -> bool:
    return all((DATA_DIR / name).is_file() for name in DATA_FILES)
