"""An OpenAI-compatible server, on 127.0.0.1, whose every chat completion is cut off at its
token limit (``finish_reason: "length"``): what docs/api.md shows the answer to."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-cut-off",
    "object": "chat.completion",
    "created": 0,
    "model": "gpt-4o-mini",
    "choices": [
        {
            "index": 0,
            "finish_reason": "length",
            "message": {"role": "assistant", "content": "- User: Hi, I just got an"},
        }
    ],
    "usage": {"prompt_tokens": 600, "completion_tokens": 1024, "total_tokens": 1624},
}


class _CutOff(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps(COMPLETION).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the page is the output."""


@contextmanager
def cut_off_summarizer() -> Iterator[str]:
    """A running server, for the duration: its base URL, as the openai client wants it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CutOff)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
