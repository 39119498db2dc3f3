"""Running a script of examples/ as a reader would: a process of its own, the example
project's settings on a fresh SQLite file, its model a local server, the offline
summarizer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.shared import REPO_ROOT


def run_example(script: str, *, base_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``examples/<script>`` against the model at ``base_url``; its output as text."""
    env = {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "test",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "CTXSUM_SUMMARIZER": "offline",
        "NO_PROXY": "127.0.0.1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, f"examples/{script}"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
