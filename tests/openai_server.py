"""A small OpenAI-compatible server for the tests, standard library only.

``FakeOpenAI`` answers ``POST /v1/chat/completions`` on 127.0.0.1 from a daemon thread and
records every request. Set ``mode`` to choose the answer:

- ``"ok"``: a valid chat.completion whose content is a deterministic summary of the user
  message (or ``reply`` when set);
- ``"error"``: HTTP ``error_status`` (500) with an OpenAI-style JSON error body;
- ``"slow"``: wait ``delay`` seconds, then answer as ``"ok"``;
- ``"hold"``: wait until ``release()`` (or ``delay`` seconds as a safety net), then answer
  as ``"ok"``: a test acts while the call is in flight, with no sleep to tune;
- ``"blank"`` / ``"null"``: content ``""`` / ``null``;
- ``"malformed"``: 200, ``Content-Type: application/json``, body ``{not json``;
- ``"text"``: 200, ``Content-Type: text/plain``, a body that is not JSON;
- ``"no_choices"``: a chat.completion with ``choices: []``.

Key facts beside the summary (the summarizer's ``facts_format``): a request with
``response_format`` of type ``json_schema`` is answered with the JSON object it asks for,
``{"summary": …, "facts": facts}`` (``facts`` defaults to ``[]``); a request without it,
with the summary followed by ``<facts>`` facts ``</facts>`` when ``facts`` is set. A
``facts`` that is a ``str`` goes in as it is (malformed JSON, say). ``reply`` is the summary
then; without ``facts``, ``reply`` is the whole content, as ever.

For the chat turn's tests, on top of the mode:

- ``script``: a list of per-request answers taken in order, each a dict with any of
  ``status`` (an error status to answer with), ``reply`` (the content), ``tool_calls``
  (the reply's tool calls), ``drop_after``; once it is empty, ``mode`` answers;
- ``model_status``: model name -> error status, for every request naming that model;
- ``tool_calls``, ``cached_tokens``: what every "ok" reply carries (tool calls instead of
  content; ``usage.prompt_tokens_details.cached_tokens``); ``reported_model``, the model
  a (non-streamed) completion names instead of the request's;
- a request with ``"stream": true`` is answered as server-sent events: a role chunk, the
  content in ``stream_pieces`` pieces (or the tool calls' deltas), a chunk with the finish
  reason, a usage chunk when ``stream_options.include_usage`` asks for it, ``[DONE]``.
  Chunked, so ``drop_after = N`` cuts the connection after N chunks, mid-body, and
  ``pause_after = N`` holds the stream after N chunks until ``resume()`` (or ``delay``
  seconds as a safety net): a test sees what reached its client while the model is still
  answering; ``chunk_delay`` seconds pass before each chunk after the first (a model that
  writes slowly: bench/asgi_streams.py).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMPLETIONS_PATH = "/v1/chat/completions"
MODES = frozenset(
    {"ok", "error", "slow", "hold", "blank", "null", "malformed", "text", "no_choices"}
)


def fake_summary(user_content: str) -> str:
    """The summary the fake answers with in "ok" mode: short, so that it is smaller than
    what it replaces even in the tests' small conversations."""
    return f"Summary of {len(user_content)} chars."


class FakeOpenAI:
    """A running fake; ``base_url`` is what the openai client wants (``…/v1``)."""

    def __init__(self, *, mode: str = "ok", delay: float = 2.0) -> None:
        self.mode = mode
        self.delay = delay
        self.reply: str | None = None
        self.finish_reason = "stop"
        self.error_status = 500
        self.script: list[dict[str, Any]] = []
        self.model_status: dict[str, int] = {}
        self.tool_calls: list[dict[str, Any]] | None = None
        self.facts: Any = None
        self.cached_tokens: int | None = None
        # The model a completion names (what ran); None: the one the request named.
        self.reported_model: str | None = None
        self.stream_pieces = 3
        self.drop_after: int | None = None
        self.pause_after: int | None = None
        self.chunk_delay = 0.0
        self._resumed = threading.Event()
        self._released = threading.Event()
        self.requests: list[dict[str, Any]] = []
        self._condition = threading.Condition()
        self._closing = threading.Event()
        self._in_flight = 0
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self.port: int = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-openai-{self.port}",
            daemon=True,
        )
        self._thread.start()

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered."""
        with self._condition:
            return self._in_flight

    def wait_for_requests(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until ``count`` requests have arrived (True) or ``timeout`` passes (False)."""
        with self._condition:
            return self._condition.wait_for(lambda: len(self.requests) >= count, timeout)

    def wait_for_in_flight(self, count: int, timeout: float = 5.0) -> bool:
        """Block until exactly ``count`` requests are in flight (True) or ``timeout`` passes."""
        with self._condition:
            return self._condition.wait_for(lambda: self._in_flight == count, timeout)

    def release(self) -> None:
        """Let every held request (mode "hold") answer, now and from now on."""
        self._released.set()

    def resume(self) -> None:
        """Let every stream paused after ``pause_after`` chunks go on, now and from now on."""
        self._resumed.set()

    def hold(self) -> None:
        """Hold requests again (mode "hold") until the next ``release()``."""
        self._released.clear()

    def reset(self) -> None:
        """Forget recorded requests and go back to "ok"."""
        with self._condition:
            self.requests.clear()
        self.mode, self.reply, self.error_status = "ok", None, 500
        self.finish_reason = "stop"
        self.script, self.model_status = [], {}
        self.tool_calls = self.cached_tokens = self.drop_after = self.facts = None
        self.reported_model = None
        self.pause_after = None

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of the requests received, in order."""
        with self._condition:
            return [request["body"] for request in self.requests]

    def _plan(self, body: Any) -> dict[str, Any]:
        """What this request is answered with: the script's next entry, the model's status,
        else the mode's answer."""
        with self._condition:
            plan = dict(self.script.pop(0)) if self.script else {}
        model = body.get("model") if isinstance(body, dict) else None
        if "status" not in plan and model in self.model_status:
            plan["status"] = self.model_status[model]
        return plan

    def close(self) -> None:
        """Stop serving; a sleeping "slow" handler wakes up and its client gets cut off."""
        self._closing.set()
        self._released.set()
        self._resumed.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAI:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _record(self, request: dict[str, Any]) -> None:
        with self._condition:
            self.requests.append(request)
            self._in_flight += 1
            self._condition.notify_all()

    def _done(self) -> None:
        with self._condition:
            self._in_flight -= 1
            self._condition.notify_all()

    def _answer(self, body: Any, plan: dict[str, Any]) -> tuple[int, str, bytes]:
        """Status, content type and body for one chat completion request."""
        mode = self.mode
        if "status" in plan:
            return plan["status"], "application/json", _json(_error_body())
        if mode not in MODES:
            return 500, "application/json", _json({"error": {"message": f"Bad mode {mode!r}"}})
        if mode == "error":
            return self.error_status, "application/json", _json(_error_body())
        if mode == "malformed":
            return 200, "application/json", b"{not json"
        if mode == "text":
            return 200, "text/plain", b"this is not a chat completion"
        content, tool_calls = self._reply(body, plan)
        message = {"role": "assistant", "content": content, "refusal": None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choices = [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else self.finish_reason,
                "logprobs": None,
            }
        ]
        asked = body.get("model", "") if isinstance(body, dict) else ""
        completion = {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": self.reported_model or asked,
            "choices": [] if mode == "no_choices" else choices,
            "usage": self._usage(body, content, tool_calls),
        }
        return 200, "application/json", _json(completion)

    def _reply(self, body: Any, plan: dict[str, Any]) -> tuple[Any, list[dict[str, Any]] | None]:
        """The reply's content and tool calls."""
        tool_calls = plan.get("tool_calls", self.tool_calls)
        if tool_calls:
            return None, tool_calls
        reply = plan.get("reply", self.reply)
        facts = plan.get("facts", self.facts)
        summary = reply if reply is not None else fake_summary(_user_content(body))
        if _structured(body) and (facts is not None or reply is None):
            content = _json_answer(summary, [] if facts is None else facts)
        elif facts is not None:
            listed = facts if isinstance(facts, str) else json.dumps(facts)
            content = f"{summary}\n<facts>{listed}</facts>"
        else:
            content = summary
        return {"blank": "", "null": None}.get(self.mode, content), None

    def _usage(self, body: Any, content: Any, tool_calls: Any) -> dict[str, Any]:
        completion_tokens = len(content or json.dumps(tool_calls or "")) // 4 + 1
        prompt_tokens = sum(len(str(m.get("content") or "")) for m in _messages(body)) // 4 + 1
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    def _wait(self) -> None:
        if self.mode == "slow":
            self._closing.wait(self.delay)
        if self.mode == "hold":
            self._released.wait(self.delay)

    def _chunks(self, body: Any, plan: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks of a streamed answer, usage chunk included when asked for."""
        content, tool_calls = self._reply(body, plan)
        base = {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": body.get("model", ""),
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return {**base, "choices": [choice]}

        chunks = [chunk({"role": "assistant", "content": ""})]
        if tool_calls:
            for index, call in enumerate(tool_calls):
                function = call["function"]
                head = {"name": function["name"], "arguments": ""}
                chunks.append(
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": index,
                                    "id": call["id"],
                                    "type": "function",
                                    "function": head,
                                }
                            ]
                        }
                    )
                )
                for piece in _pieces(function["arguments"], 2):
                    delta = {"index": index, "function": {"arguments": piece}}
                    chunks.append(chunk({"tool_calls": [delta]}))
        else:
            for piece in _pieces(content or "", self.stream_pieces):
                chunks.append(chunk({"content": piece}))
        chunks.append(chunk({}, "tool_calls" if tool_calls else self.finish_reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**base, "choices": [], "usage": self._usage(body, content, tool_calls)})
        return chunks


@contextmanager
def running_fake_openai(monkeypatch: Any, **options: Any) -> Iterator[FakeOpenAI]:
    """A started ``FakeOpenAI(**options)``, closed afterwards, that no proxy from the
    environment captures (``monkeypatch`` sets ``NO_PROXY``)."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    with FakeOpenAI(**options) as server:
        yield server


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Room for many clients connecting at once (100 streamed turns: tests/test_asgi_server.py,
    # bench/asgi_streams.py); the default of 5 turns the others away while it accepts.
    request_queue_size = 256
    fake: FakeOpenAI

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out has hung up before the slow answer: not worth a traceback.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        if self.path.split("?")[0] != COMPLETIONS_PATH:
            self._send(404, "application/json", _json({"error": {"message": "Not found."}}))
            return
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        fake = self.server.fake
        fake._record(
            {
                "method": "POST",
                "path": self.path,
                "headers": {key.lower(): value for key, value in self.headers.items()},
                "body": body,
            }
        )
        try:
            if body is None:
                error = {"error": {"message": "Request body is not JSON.", "type": "invalid"}}
                self._send(400, "application/json", _json(error))
                return
            plan = fake._plan(body)
            fake._wait()
            if isinstance(body, dict) and body.get("stream") and "status" not in plan:
                drop_after = plan.get("drop_after", fake.drop_after)
                self._stream(fake._chunks(body, plan), drop_after, fake.pause_after)
            else:
                self._send(*fake._answer(body, plan))
        finally:
            fake._done()

    def _stream(
        self, chunks: list[dict[str, Any]], drop_after: int | None, pause_after: int | None
    ) -> None:
        """Server-sent events in a chunked body; cut off after ``drop_after`` events, held
        after ``pause_after`` until ``resume()``."""
        self.protocol_version = "HTTP/1.1"
        self.close_connection = True
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
            for number, event in enumerate(events):
                if drop_after is not None and number >= drop_after:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if pause_after is not None and number == pause_after:
                    self.server.fake._resumed.wait(self.server.fake.delay)
                if number and self.server.fake.chunk_delay:
                    time.sleep(self.server.fake.chunk_delay)
                data = event.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass

    def do_GET(self) -> None:
        self._send(404, "application/json", _json({"error": {"message": "Not found."}}))

    def _send(self, status: int, content_type: str, payload: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _error_body() -> dict[str, Any]:
    return {
        "error": {
            "message": "The fake server had an error.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }


def _pieces(text: str, count: int) -> list[str]:
    """``text`` in ``count`` pieces (fewer when it is shorter), joined back exactly."""
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[start : start + size] for start in range(0, len(text), size)]


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _structured(body: Any) -> bool:
    """Whether the request asks for structured output (``response_format`` json_schema)."""
    response_format = body.get("response_format") if isinstance(body, dict) else None
    return isinstance(response_format, dict) and response_format.get("type") == "json_schema"


def _json_answer(summary: str, facts: Any) -> str:
    """The structured answer: the summary and the facts (a ``str`` goes in as it is)."""
    listed = facts if isinstance(facts, str) else json.dumps(facts)
    return f'{{"summary": {json.dumps(summary)}, "facts": {listed}}}'


def _messages(body: Any) -> list[dict[str, Any]]:
    messages = body.get("messages") if isinstance(body, dict) else None
    return [m for m in messages or [] if isinstance(m, dict)]


def _user_content(body: Any) -> str:
    """The last user message's text (text parts joined when it is a list of parts)."""
    for message in reversed(_messages(body)):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content or ""
    return ""
