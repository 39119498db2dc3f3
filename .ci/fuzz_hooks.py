"""schemathesis hooks for .ci/fuzz: path ids that reach real conversations, and a log of
every request made.

schemathesis generates the ``{id}`` of a path from the schema: a well-formed UUID that names
no conversation, or a malformed one. Most well-formed ids are swapped here for one of the
conversations the fuzz step made (FUZZ_CONVERSATIONS), so the operations run on real data;
a DELETE gets a conversation made for it, so the others survive. An id the API answered with
(a conversation the fuzzer created) is left as it is, and so is one in ten well-formed ids
and every malformed one: those must answer 404.

Environment: FUZZ_BASE_URL (the API's root), FUZZ_TOKEN, FUZZ_CONVERSATIONS (ids, comma
separated), FUZZ_LOG (a file that gets one line per request: method, path, status).
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import requests
import schemathesis

CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
POOL = os.environ["FUZZ_CONVERSATIONS"].split(",")
# Ids of conversations the API created for the fuzzer's own requests.
created: set[str] = set()
lock = threading.Lock()


def _session() -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Token {os.environ['FUZZ_TOKEN']}"
    return session


def _fresh_conversation() -> str:
    """A conversation made for one DELETE."""
    response = _session().post(
        f"{os.environ['FUZZ_BASE_URL']}conversations/",
        json={"title": "to delete", "messages": [{"role": "user", "content": "Bye."}]},
        timeout=30,
    )
    response.raise_for_status()
    conversation: str = response.json()["id"]
    _log("SETUP", "/api/conversations/", response.status_code)
    return conversation


def _log(method: str, path: str, status: int) -> None:
    with lock, open(os.environ["FUZZ_LOG"], "a", encoding="utf-8") as log:
        log.write(f"{method}\t{path}\t{status}\n")


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    conversation = (case.path_parameters or {}).get("id")
    if not isinstance(conversation, str) or not CANONICAL_UUID.fullmatch(conversation):
        return
    with lock:
        known = conversation in created
    if case.method.upper() == "DELETE" and not known:
        case.path_parameters["id"] = _fresh_conversation()
    elif not known and int(conversation[:8], 16) % 10:
        case.path_parameters["id"] = POOL[int(conversation[-8:], 16) % len(POOL)]


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    _log(case.method.upper(), case.operation.path, response.status_code)
    if case.method.upper() == "POST" and case.operation.path.endswith("/conversations/"):
        try:
            body = response.json()
        except ValueError:
            return
        if isinstance(body, dict) and isinstance(body.get("id"), str):
            with lock:
                created.add(body["id"])
