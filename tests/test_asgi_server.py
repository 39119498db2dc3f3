"""The example project under uvicorn (``project.asgi:application``, one worker) on
PostgreSQL, its chat model the local fake server: 100 streamed turns at once all stream
while their model is still answering, all are stored, and the worker holds no more than a
few database connections meanwhile.

The fake server holds every stream after its first piece of text until the test resumes
it, so that each client has its first delta while no model has finished: with a server
that buffered a stream, or served one turn at a time, the first deltas would never all
arrive and the test would fail at its deadline. Times are measured, not asserted
(docs/PERFORMANCE.md has the benchmark)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from ctxsum.chat.models import ChatTurn
from ctxsum.services import conversation_create
from tests.openai_server import FakeOpenAI, running_fake_openai
from tests.postgres import POSTGRES
from tests.test_killed_worker import database_url

pytestmark = [
    *POSTGRES,
    pytest.mark.skipif(
        importlib.util.find_spec("uvicorn") is None, reason="needs uvicorn: pip install uvicorn"
    ),
]

ROOT = Path(__file__).resolve().parents[1]
TURNS = 100
DEADLINE = 90  # seconds for every first delta: generous, for a loaded CI machine
REPLY = "One two three four."


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_uvicorn(fake: FakeOpenAI, port: int) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_worker",
        "DATABASE_URL": database_url(),
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "x",
        "ALLOWED_HOSTS": "127.0.0.1",
        "NO_PROXY": "127.0.0.1,localhost",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "uvicorn", "project.asgi:application"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(
                f"uvicorn stopped: {server.stdout.read() if server.stdout else ''}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise AssertionError("uvicorn did not start")


def connections_to(database: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [database],
        )
        return int(cursor.fetchone()[0])


async def stream_turn(
    client: httpx.AsyncClient, url: str, token: str, first: asyncio.Event, counted: list[float]
) -> list[str]:
    """One streamed turn: its events; ``counted`` gets the time to its first delta."""
    started = time.monotonic()
    body = {"message": {"role": "user", "content": "Count."}, "stream": True}
    headers = {"Authorization": f"Token {token}"}
    lines: list[str] = []
    async with client.stream("POST", url, json=body, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            lines.append(line)
            if not first.is_set() and '"content": "One ' in line:
                counted.append(time.monotonic() - started)
                first.set()
    return lines


def test_a_hundred_streamed_turns_stream_at_once_on_one_uvicorn_worker(
    django_user_model, monkeypatch
):
    owner = django_user_model.objects.create_user("streams", password="x")
    token = Token.objects.create(user=owner).key
    conversations = [conversation_create(owner=owner, system="Be brief.") for _ in range(TURNS)]
    with running_fake_openai(monkeypatch, delay=DEADLINE + 30) as fake:
        fake.reply = REPLY
        fake.pause_after = 2  # the role chunk and the first piece, then held
        port = free_port()
        server = start_uvicorn(fake, port)
        try:
            base = f"http://127.0.0.1:{port}/api/conversations/"
            during: dict[str, Any] = {}

            async def run() -> list[list[str]]:
                limits = httpx.Limits(max_connections=TURNS + 10)
                timeout = httpx.Timeout(DEADLINE + 60)
                async with httpx.AsyncClient(
                    limits=limits, timeout=timeout, trust_env=False
                ) as client:
                    firsts = [asyncio.Event() for _ in conversations]
                    counted: list[float] = []
                    tasks = [
                        asyncio.create_task(
                            stream_turn(client, f"{base}{c.pk}/chat/", token, firsts[i], counted)
                        )
                        for i, c in enumerate(conversations)
                    ]
                    waiting = asyncio.gather(*(first.wait() for first in firsts))
                    await asyncio.wait_for(waiting, DEADLINE)
                    # Every client has its first delta, and no model has finished.
                    during["in_flight"] = fake.in_flight
                    during["connections"] = await asyncio.to_thread(
                        connections_to, connection.settings_dict["NAME"]
                    )
                    during["first_delta"] = sorted(counted)
                    fake.resume()
                    return await asyncio.gather(*tasks)

            results = asyncio.run(run())
        finally:
            server.terminate()
            output, _ = server.communicate(timeout=10)

    assert during["in_flight"] == TURNS, output
    # The worker's database work runs in one thread: one connection (two while Django
    # closes and opens one), however many turns stream.
    assert during["connections"] <= 3, during
    for lines in results:
        events = [line for line in lines if line]
        assert events[-1] == "data: [DONE]"
        answer = json.loads(events[-2].removeprefix("data: "))
        assert answer["messages"][-1]["content"] == REPLY
    assert ChatTurn.objects.filter(conversation__owner=owner, streamed=True).count() == TURNS
    ranked = during["first_delta"]
    print(f"time to first delta: median {ranked[len(ranked) // 2]:.2f} s, p95 {ranked[94]:.2f} s")
