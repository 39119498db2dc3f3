"""docs/api.md: the errors, and the input that is refused, each row from a real request."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from ctxsum.conf import ctxsum_settings
from project.api_docs import render
from project.api_docs.document import OTHER_USER, Document, Exchange, expect

MESSAGES = "/conversations/$CONV/messages/"
# An id in canonical form that no conversation has.
NO_SUCH_ID = "00000000-0000-4000-8000-000000000000"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _request(exchange: Exchange) -> str:
    return render.table_cell(exchange.line())


def errors(document: Document) -> None:
    document.text(
        """
        ## Errors

        Every error answers JSON: `detail` (for people) and `code` (for programs), or, for a
        400 about fields, each field with its errors. Someone else's conversation answers
        exactly like one that does not exist.
        """
    )
    rows = [_row("request", "answer"), _row("---", "---")]
    for body in INVALID_CONVERSATIONS:
        exchange = document.call("POST", "/conversations/", body)
        rows.append(_row(_request(exchange), document.cell(exchange)))
    rows += [_row(what, document.cell(exchange)) for what, exchange in _failures(document)]
    document.text("\n".join(rows))


INVALID_CONVERSATIONS = [
    {"policy": {"trigger": {"messages": 4}, "keep": {"messages": 4}}},
    {"policy": {"trigger": {"messages": 12}, "keep": {"messages": 10}}},
    {"policy": {"max_context_tokens": 0}},
    {"policy": {"max_context_tokens": 3_000_000_000}},
    {"policy": {"ceiling": 5}},
    {"title": 5},
    {"messages": [{"role": "user", "content": "hi", "foo": 1}]},
]


def _failures(document: Document) -> list[tuple[str, Exchange]]:
    """The requests of the errors table that are described rather than shown."""
    call, other = document.call, document.tokens[OTHER_USER]
    chunked = call("POST", MESSAGES, raw="{}", headers={"Transfer-Encoding": "chunked"})
    return [
        ("a message over `MAX_MESSAGE_BYTES`", _message_too_large(document)),
        ("a request body over `MAX_BODY_BYTES`", _body_too_large(document)),
        ("a body sent `Transfer-Encoding: chunked`", chunked),
        ("a body that is not JSON", call("POST", MESSAGES, raw="not json")),
        ("someone else's conversation", call("GET", "/conversations/$CONV/", token=other)),
        (f"no such conversation (`{NO_SUCH_ID}`)", call("GET", f"/conversations/{NO_SUCH_ID}/")),
        ("a URL under `$API` that names nothing", call("GET", "/conversation/")),
        ("a method the endpoint does not have", call("DELETE", MESSAGES)),
        ("the summarizer fails", document.recorded["summarizer_error"]),
        ("no credentials", call("GET", "/conversations/", token="")),
        ("a token that is not one", call("GET", "/conversations/", token="0" * 40)),
    ]


def _message_too_large(document: Document) -> Exchange:
    content = "x" * ctxsum_settings.MAX_MESSAGE_BYTES
    return document.call("POST", MESSAGES, {"role": "user", "content": content})


def _body_too_large(document: Document) -> Exchange:
    content = "x" * ctxsum_settings.MAX_BODY_BYTES
    return document.call("POST", MESSAGES, raw=json.dumps({"role": "user", "content": content}))


@dataclass(frozen=True)
class Refusal:
    """A rule of what input is refused, and a request that breaks it."""

    path: str
    body: str
    rule: str


REFUSALS = [
    Refusal(
        MESSAGES,
        r'{"role": "user", "content": "a\u0000b"}',
        "a NUL character (`\\u0000`) in any string or key — content, name, role, "
        "tool_call_id, tool call ids and arguments, parts, metadata (values and keys), title, "
        "model, system: PostgreSQL's text and jsonb cannot hold it, and no model needs it",
    ),
    Refusal(
        "/conversations/",
        r'{"metadata": {"\ud800": 1}}',
        "an unpaired surrogate (`\\ud800` to `\\udfff`) anywhere, keys included: it is not "
        "text (no UTF-8 encodes it)",
    ),
    Refusal(
        "/conversations/",
        '{"metadata": {"n": 1e400}}',
        "a number that is not finite (`1e400` parses as infinity) anywhere: JSON has no such "
        "number",
    ),
    Refusal(
        MESSAGES,
        '{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]}',
        "a content part with a key its type does not have: `text` has `text`; `image_url` has "
        "`url` and `detail`; `input_audio` has `data` and `format`; `file` has `file_data`, "
        "`file_id`, `filename` (strings)",
    ),
    Refusal(MESSAGES, '{"messages": 123}', "a batch that is not a list"),
    Refusal(MESSAGES, '{"messages": []}', "an empty batch"),
    Refusal(
        MESSAGES,
        '{"role": "tool", "tool_call_id": "call_note_05", "content": "again"}',
        "a second tool result for a call that has one; a result answers the nearest earlier "
        "request with its id, so a provider that reuses an id for a new call can answer the "
        "new one",
    ),
]


def refused(document: Document) -> None:
    document.text(
        """
        ## What input is refused

        A message is checked against what OpenAI's chat completions API takes, and against
        what a database can store. Each rule answers 400 naming the field (`messages.i.field` in a
        batch), and nothing of the request is stored:
        """
    )
    rows = [_row("request", "answer", "rule"), _row("---", "---", "---")]
    before = document.call("GET", "/conversations/$CONV/").data
    for refusal in REFUSALS:
        exchange = document.call("POST", refusal.path, raw=refusal.body)
        rows.append(_row(_request(exchange), document.cell(exchange), refusal.rule))
    after = document.call("GET", "/conversations/$CONV/").data
    expect(before == after, "nothing of a refused request is stored")
    upper = document.call("GET", "/conversations/" + document.variables["CONV"].upper() + "/")
    rows.append(
        _row(
            "`GET $API/conversations/$CONV/` with the id in capitals",
            document.cell(upper),
            "an id that is not the canonical lower-case UUID (`urn:uuid:…`, `{…}`, capitals, "
            "no hyphens) answers as any unknown conversation: one name per conversation",
        )
    )
    document.text("\n".join(rows))


SECTIONS: tuple[Callable[[Document], None], ...] = (errors, refused)
