"""Streamed chat turns at once: the example project under uvicorn (ASGI, one process)
against gunicorn's sync workers (WSGI), on PostgreSQL, the chat model a local fake that
writes slowly (tests/openai_server.py: ``--pieces`` pieces, ``--chunk-delay`` seconds
apart).

``--turns`` clients each start one streamed turn (``POST …/chat/`` with ``"stream":
true``) on a conversation of their own, all at once, over HTTP with httpx. For each: the
time to its first delta (the first piece of text) and to its end. Then: how many turns
were streaming at the same moment at most (from first delta to end), the servers' memory
(the resident set of the server and its workers, from /proc) idle and at that moment, the
memory per open stream (the difference over the streams open), and the database
connections the servers held then (pg_stat_activity).

    python -m bench.asgi_streams [--turns N] [--pieces N] [--chunk-delay S]
                                 [--wsgi-workers N] [--servers asgi wsgi]
                                 [--database-url URL] [--output PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.command import Run
from bench.common import disposable_database, summary_of
from tests.support.shared import REPO_ROOT

DEFAULT_DATABASE = "postgres://root@127.0.0.1:5432/wtperf_asgi_streams"
SETTINGS = "project.settings"
SERVERS = ("asgi", "wsgi")
REPLY = "One two three four five six seven eight nine ten."


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.asgi_streams", description=__doc__)
    parser.add_argument("--turns", type=int, default=100, help="turns started at once")
    parser.add_argument("--pieces", type=int, default=10, help="pieces of the model's reply")
    parser.add_argument("--chunk-delay", type=float, default=0.5, help="seconds between two chunks")
    parser.add_argument(
        "--wsgi-workers",
        type=int,
        default=4,
        help="gunicorn sync workers (the 4 of docs/how-to/deploy.md)",
    )
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument("--output", type=Path)
    return parser.parse_args(argv)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def server_command(kind: str, port: int, workers: int) -> list[str]:
    address = f"127.0.0.1:{port}"
    if kind == "asgi":
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "project.asgi:application",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "project.wsgi",
        "--bind",
        address,
        "--workers",
        str(workers),
        "--timeout",
        "600",
        "--log-level",
        "warning",
    ]


def start(kind: str, args: argparse.Namespace, env: dict[str, str]) -> tuple[Any, int]:
    port = free_port()
    server = subprocess.Popen(
        server_command(kind, port, args.wsgi_workers),
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {server.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                time.sleep(1)  # gunicorn's workers after its arbiter
                return server, port
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"{kind} server did not start")


def resident_kb(pid: int) -> int:
    """The resident set of ``pid`` and its children, in kB."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(child) for child in children.read_text().split()]
    for each in pids:
        status = Path(f"/proc/{each}/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def connections_held(database: str, mine: Sequence[int]) -> int:
    """The connections to ``database`` but the benchmark's own (``mine``, and this one)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND pid <> pg_backend_pid() AND NOT pid = ANY(%s)",
            [database, list(mine)],
        )
        return int(cursor.fetchone()[0])


def backend_pid() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


async def one_turn(client: Any, url: str, token: str, started: float) -> dict[str, Any]:
    body = {"message": {"role": "user", "content": "Count to ten."}, "stream": True}
    first = None
    async with client.stream(
        "POST", url, json=body, headers={"Authorization": f"Token {token}"}
    ) as response:
        status = response.status_code
        async for line in response.aiter_lines():
            if first is None and '"content": "One' in line:
                first = time.monotonic() - started
    return {"status": status, "first": first, "end": time.monotonic() - started}


async def warm_up(port: int, token: str, conversations: Sequence[Any]) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(600), trust_env=False) as client:
        base = f"http://127.0.0.1:{port}/api/conversations/"
        await asyncio.gather(
            *(one_turn(client, f"{base}{c.pk}/chat/", token, 0.0) for c in conversations)
        )


def run_server(kind: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    import httpx
    from django.contrib.auth import get_user_model
    from django.db import connection
    from rest_framework.authtoken.models import Token

    from ctxsum.services import conversation_create

    owner = get_user_model().objects.create_user(f"streams-{kind}")
    token = Token.objects.create(user=owner).key
    conversations = [
        conversation_create(owner=owner, system="Be brief.") for _ in range(args.turns)
    ]
    warm = [conversation_create(owner=owner, system="Be brief.") for _ in range(8)]
    server, port = start(kind, args, env)
    database, mine = connection.settings_dict["NAME"], [backend_pid()]
    try:
        # A turn on each worker first (imports, encodings, clients): not counted.
        asyncio.run(warm_up(port, token, warm))
        idle_kb = resident_kb(server.pid)
        peak: dict[str, int] = {"kb": idle_kb, "connections": 0}
        stop = threading.Event()

        def sample() -> None:
            from django.db import connection as own

            while not stop.is_set():
                peak["kb"] = max(peak["kb"], resident_kb(server.pid))
                held = connections_held(database, mine)
                peak["connections"] = max(peak["connections"], held)
                time.sleep(0.2)
            own.close()

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        async def all_turns() -> list[dict[str, Any]]:
            limits = httpx.Limits(max_connections=args.turns + 10)
            timeout = httpx.Timeout(3600)
            async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
                started = time.monotonic()
                base = f"http://127.0.0.1:{port}/api/conversations/"
                return await asyncio.gather(
                    *(
                        one_turn(client, f"{base}{c.pk}/chat/", token, started)
                        for c in conversations
                    )
                )

        turns = asyncio.run(all_turns())
        stop.set()
        sampler.join()
    finally:
        server.terminate()
        server.wait(timeout=30)
    ok = [turn for turn in turns if turn["status"] == 200 and turn["first"] is not None]
    events = sorted([(t["first"], 1) for t in ok] + [(t["end"], -1) for t in ok])
    open_now = most_open = 0
    for _, change in events:
        open_now += change
        most_open = max(most_open, open_now)
    per_stream = (peak["kb"] - idle_kb) / most_open if most_open else None
    return {
        "server": kind,
        "turns": args.turns,
        "answered": len(ok),
        "statuses": sorted({turn["status"] for turn in turns}),
        "first_delta_s": summary_of([t["first"] for t in ok], digits=2),
        "end_s": summary_of([t["end"] for t in ok], digits=2),
        "most_open_streams": most_open,
        "resident_kb": {"idle": idle_kb, "peak": peak["kb"]},
        "kb_per_open_stream": round(per_stream, 1) if per_stream is not None else None,
        "connections_peak": peak["connections"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    run = Run("asgi_streams", argv)
    from tests.openai_server import FakeOpenAI
    from tests.support.shared import use_tiktoken_cache

    use_tiktoken_cache()
    with FakeOpenAI(delay=600) as fake:
        fake.reply, fake.stream_pieces, fake.chunk_delay = REPLY, args.pieces, args.chunk_delay
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": SETTINGS,
            "DATABASE_URL": args.database_url,
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_API_KEY": "bench",
            "ALLOWED_HOSTS": "127.0.0.1",
            "DEBUG": "false",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        os.environ.update({k: env[k] for k in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")})
        with disposable_database(args.database_url):
            import django

            django.setup()
            from django.core.management import call_command
            from django.db import connections

            call_command("migrate", verbosity=0, interactive=False)
            results = []
            for kind in args.servers:
                progress(f"{kind}: {args.turns} turns")
                results.append(run_server(kind, args, env))
                progress(json.dumps(results[-1]))
            connections.close_all()
    fields = {
        "pieces": args.pieces,
        "chunk_delay": args.chunk_delay,
        "wsgi_workers": args.wsgi_workers,
        "servers": results,
    }
    return run.finish(fields, args, draw=lambda report: [], lines=summary_lines)


def summary_lines(report: dict[str, Any]) -> list[str]:
    return [
        f"{r['server']}: {r['answered']}/{r['turns']} answered, "
        f"first delta {r['first_delta_s']} s, at most {r['most_open_streams']} open at once, "
        f"{r['kb_per_open_stream']} kB each, "
        f"{r['connections_peak']} connections at most"
        for r in report["servers"]
    ]


if __name__ == "__main__":
    sys.exit(main())
