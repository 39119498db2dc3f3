"""The API's documentation runs: docs/api.md is what its requests answer today, and the
quickstart's curl walkthrough (docs/quickstart.md) works, in order, against a live server."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest
from rest_framework.authtoken.models import Token

from project.api_docs import generate, render
from tests.factories import OFFLINE_SUMMARIZER
from tests.support.pages import assert_page_is
from tests.support.shared import REPO_ROOT

QUICKSTART = REPO_ROOT / "docs" / "quickstart.md"
WALKTHROUGH = "\n## The REST API with curl\n"
BASH = shutil.which("bash")
CURL = shutil.which("curl")

needs_bash = pytest.mark.skipif(BASH is None, reason="bash expands the examples' variables")


@pytest.mark.django_db(transaction=True)
def test_docs_api_md_is_what_its_requests_answer():
    # Transactional, as the requests of `make docs` are: an automatic compaction runs once
    # its append has committed, not deferred inside a test's transaction.
    assert_page_is("docs/api.md", generate(), "what the requests answer")


# --------------------------------------------------------------------------- the walkthrough


def walkthrough_blocks() -> tuple[str, str]:
    """The quickstart's curl walkthrough: its setup block (``auth=(…)``) and the shell blocks
    after it, in the order the page gives them, as one script."""
    text = QUICKSTART.read_text(encoding="utf-8")
    section = text.split(WALKTHROUGH, 1)[1].split("\n## ", 1)[0]
    blocks = [part.split("\n```", 1)[0] for part in section.split("```sh\n")[1:]]
    setup = next(index for index, block in enumerate(blocks) if "auth=(" in block)
    return blocks[setup], "\n".join(blocks[setup + 1 :])


def shell_commands(block: str) -> list[str]:
    """The commands of a shell block, each with its continuation lines and multi-line
    quotes; comments and blank lines left out."""
    commands, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.rstrip().endswith("\\") or not _complete(pending):
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            commands.append(pending)
        pending = ""
    assert not pending, f"an unfinished command: {pending!r}"
    return commands


def _complete(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:  # an open quote: the command goes on
        return False
    return True


def expand(definitions: str, command: str, env: dict[str, str]) -> list[str]:
    """The arguments bash gives ``command`` (variables, arrays, quotes), after the setup
    block's ``definitions``: exactly what curl would receive."""
    script = f'{definitions}\nset -- {command}\nprintf "%s\\0" "$@"'
    result = subprocess.run(
        [BASH, "-c", script], env=env, capture_output=True, text=True, check=True, timeout=10
    )
    return result.stdout.split("\0")[:-1]


def url(argv: list[str]) -> str:
    (found,) = [word for word in argv if word.startswith(("http://", "https://"))]
    return found


def send_with_curl(argv: list[str]) -> tuple[int, str]:
    written = subprocess.run(
        [CURL, "--silent", "--show-error", "--write-out", "\n%{http_code}", *argv[1:]],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    body, _, status = written.stdout.rpartition("\n")
    return int(status), body


# -s (no progress meter), -N (no buffering of a stream), and the two together.
OUTPUT_ONLY = frozenset({"-s", "-N", "-sN"})


def send_with_urllib(argv: list[str]) -> tuple[int, str]:
    """The request curl would make of ``argv``: its -H headers, -X method, -d body and URL;
    any other option fails the test rather than be dropped."""
    headers, method, data, urls = {}, None, None, []
    words = iter(argv[1:])
    for word in words:
        if word == "-H":
            name, _, value = next(words).partition(":")
            headers[name.strip()] = value.strip()
        elif word == "-X":
            method = next(words)
        elif word == "-d":
            data = next(words).encode()
        elif word in OUTPUT_ONLY:  # how curl shows the answer, not what it sends
            continue
        else:
            assert not word.startswith("-"), f"curl option {word} has no translation"
            urls.append(word)
    (url,) = urls
    method = method or ("POST" if data is not None else "GET")
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


TRANSPORTS = [
    pytest.param(
        send_with_curl,
        id="curl",
        marks=pytest.mark.skipif(CURL is None, reason="no curl on this machine"),
    ),
    pytest.param(send_with_urllib, id="urllib"),
]


@pytest.fixture
def walkthrough_settings(settings, live_server, model_server):
    """The example project's settings as `make run` has them with no OpenAI variable set,
    without the network: the offline summarizer, and a chat model on 127.0.0.1 (the local
    OpenAI-compatible server of tests/openai_server.py)."""
    settings.CTXSUM = {
        **settings.CTXSUM,
        "SUMMARIZER": OFFLINE_SUMMARIZER,
        "CHAT_OPTIONS": {"base_url": model_server.base_url, "api_key": "x"},
        "CHAT_RETRY_BACKOFF": 0,
    }
    return live_server


def answer_json(body: str) -> dict | None:
    try:
        answer = json.loads(body)
    except ValueError:  # a streamed turn's server-sent events
        return None
    return answer if isinstance(answer, dict) else None


@needs_bash
@pytest.mark.parametrize("send", TRANSPORTS)
@pytest.mark.ctxsum_defaults
@pytest.mark.django_db(transaction=True)
def test_the_quickstart_curl_walkthrough_runs_in_order(
    send, walkthrough_settings, django_user_model
):
    live_server = walkthrough_settings
    setup, examples = walkthrough_blocks()
    definitions = "\n".join(
        line for line in setup.splitlines() if line.startswith(("auth=(", "json=("))
    )
    user = django_user_model.objects.create_user(username="reader")
    token = Token.objects.create(user=user).key
    env = {"PATH": os.environ.get("PATH", ""), "TOKEN": token, "API": f"{live_server.url}/api"}
    answered = []
    for command in shell_commands(examples):
        if command.startswith("export CONV="):
            # The page names the conversation its create answered: so does the test.
            (method, path, _, body) = answered[-1]
            assert (method, path) == ("POST", "/api/conversations/"), command
            env["CONV"] = json.loads(body)["id"]
            continue
        argv = expand(definitions, command, env)
        assert argv[0] == "curl", command
        status, body = send(argv)
        assert 200 <= status < 300, f"{command}\n-> {status} {body}"
        method = argv[argv.index("-X") + 1] if "-X" in argv else "GET"
        if method == "GET" and "-d" in argv:
            method = "POST"
        answered.append((method, url(argv).removeprefix(live_server.url), status, body))

    assert len(answered) == examples.count("curl ")
    # Every request of the page was made, in order, and the conversation's deletion last.
    assert [(method, status) for method, _, status, _ in answered][-1] == ("DELETE", 204)
    assert [method for method, *_ in answered].count("DELETE") == 1
    # One of the answers is a compaction that compacted, as the page shows it.
    compactions = [
        answer_json(body) for _, path, _, body in answered if path.endswith("/compact/")
    ]
    made = [answer for answer in compactions if answer and answer["compacted"] is True]
    assert len(made) == 1, compactions
    assert made[0]["reason"] == "compacted" and made[0]["summary"]["version"] == 1
    assert '# {"compacted": true, "reason": "compacted"' in examples
    # The chat turns were answered by the model, the streamed one to its end.
    turns = [body for _, path, _, body in answered if path.endswith("/chat/")]
    assert len(turns) == 2
    assert len(answer_json(turns[0])["messages"]) == 2
    assert "event: ctxsum" in turns[1] and turns[1].rstrip().endswith("data: [DONE]")
    # The redaction left a stale summary that the rebuild wrote anew.
    redacted = next(i for i, (_, path, *_) in enumerate(answered) if path.endswith("/redact/"))
    assert answer_json(answered[redacted][3])["content"] == "[redacted]"
    (summary,) = answer_json(answered[redacted + 1][3])["results"]
    assert (summary["version"], summary["stale"]) == (1, True)
    (rebuilt,) = [
        answer_json(body) for _, path, _, body in answered if path.endswith("/rebuild/")
    ]
    assert rebuilt["rebuilt"] is True, rebuilt


@needs_bash
def test_a_documented_curl_sends_the_body_it_shows():
    body = render.body_text({"content": "It's 23 kg, \"checked\" — $HOME stays as written."})
    command = render.curl("POST", "/conversations/", body)
    definitions = 'auth=(-H "Authorization: Token t")\njson=(-H "Content-Type: application/json")'
    argv = expand(definitions, command, {"API": "http://127.0.0.1:8000/api"})
    assert argv[argv.index("-d") + 1] == body
    assert url(argv) == "http://127.0.0.1:8000/api/conversations/"


def test_answers_show_stable_names_for_ids_and_times():
    names = {"8d0c8a8e-9a49-4c1b-9b0e-5b8f1c7e2a11": "$CONV"}
    answer = {
        "id": "8d0c8a8e-9a49-4c1b-9b0e-5b8f1c7e2a11",
        "other": "0f6f7e7c-1111-4222-8333-944445555666",
        "created_at": "2026-12-01T04:20:04.539681Z",
        "next": "http://127.0.0.1:8000/api/conversations/8d0c8a8e-9a49-4c1b-9b0e-5b8f1c7e2a11/",
    }
    shown = render.shorten(answer, render.Shortening(names=names))
    assert shown == {
        "id": "$CONV",
        "other": "<id>",
        "created_at": "<time>",
        "next": "http://127.0.0.1:8000/api/conversations/$CONV/",
    }

