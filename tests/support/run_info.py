"""What a benchmark result must say about where it ran: the machine, the commit, the
database and how busy the machine was, since timings mean little without them."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any

from tests.support.shared import REPO_ROOT


def machine_info() -> dict[str, Any]:
    """Platform, CPU model and count, Python version."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def git_info() -> dict[str, Any]:
    """The commit the replay ran on, and whether the working tree had changes in ctxsum/."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "ctxsum"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "ctxsum_changed": None}
    return {"commit": commit, "ctxsum_changed": bool(status.strip())}


def database_info() -> dict[str, Any]:
    """The vendor and server version of the default database (Django is set up)."""
    from django.db import connection

    connection.ensure_connection()
    if connection.vendor == "sqlite":
        version = connection.Database.sqlite_version
    elif connection.vendor == "postgresql":
        number = connection.pg_version
        version = f"{number // 10000}.{number % 10000}"
    else:
        version = "?"
    return {"vendor": connection.vendor, "version": version}


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded."""
    return [round(value, 2) for value in os.getloadavg()]
