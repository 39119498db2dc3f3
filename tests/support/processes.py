"""A Python script run in a process of its own, for the tests that need a Django set up
otherwise than the suite's (INSTALLED_APPS and the database are read once per process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any


def script_report(script: str, *, cwd: Path, env: dict[str, str], timeout: float) -> Any:
    """Run ``script`` (dedented) with ``env`` in ``cwd``; the JSON it prints last. Fails
    the test, with the process's output, when it exits with an error."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
