"""The document being written: Markdown text, and requests made through Django's test
client and recorded as they were sent and answered."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.test import Client

from project.api_docs import render

API = "/api"
# What the document's setup block calls the server: `make run`'s address.
HOST = "127.0.0.1:8000"
# The demo user, whose token the requests send, and a second user.
READER = "demo"
OTHER_USER = "mallory"
# What an answer shows of a summary when the summary is not the point.
SUMMARY_IN_SHORT = frozenset({"summary.version", "summary.covers", "summary.output_tokens"})


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """One request as sent (``path`` under ``$API``, with the document's variables) and
    the server's answer."""

    method: str
    path: str
    body: str | None
    status: int
    data: Any
    headers: tuple[str, ...] = ()

    def line(self) -> str:
        """The request in a few words, for a table: its method, path and body."""
        words = [self.method, f"$API{self.path}", *([] if self.body is None else [self.body])]
        return " ".join(words)


@dataclass
class Document:
    """Markdown in the making. ``call`` makes a request; ``request`` makes it and shows it
    as a curl command with its answer."""

    reader: str  # whose token the requests send unless they name another user
    tokens: Mapping[str, str]  # user name -> API token
    client: Client = field(default_factory=lambda: Client(HTTP_HOST=HOST))
    variables: dict[str, str] = field(default_factory=dict)  # CONV -> its id
    # Answers a later section shows again, by what they show.
    recorded: dict[str, Exchange] = field(default_factory=dict)
    # Numbers the prose of a later section reuses.
    facts: dict[str, int] = field(default_factory=dict)
    chunks: list[str] = field(default_factory=list)

    def text(self, markdown: str) -> None:
        """Markdown; its paragraphs of prose are folded to the page's width."""
        paragraphs = textwrap.dedent(markdown).strip().split("\n\n")
        self.chunks += [_fold(paragraph) for paragraph in paragraphs]

    def name(self, variable: str, value: str) -> None:
        """From now on ``$variable`` in a path means ``value``, and ``value`` in an answer
        shows as ``$variable``."""
        self.variables[variable] = value

    def markdown(self) -> str:
        return "\n\n".join(self.chunks) + "\n"

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: str | None = None,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Exchange:
        """Send a request; ``body`` is JSON (sent as the document shows it), ``raw`` the
        exact body. ``token`` replaces the reader's token (``""``: none is sent)."""
        sent = render.body_text(body) if body is not None else raw
        sent_headers = dict(headers or {})
        token = self.tokens[self.reader] if token is None else token
        if token:
            sent_headers["Authorization"] = f"Token {token}"
        response = self.client.generic(
            method,
            API + self._expand(path),
            data=(sent or "").encode(),
            content_type="application/json",
            headers=sent_headers,
        )
        content = response.content
        return Exchange(
            method=method,
            path=path,
            body=sent,
            status=response.status_code,
            data=json.loads(content) if content else None,
            headers=tuple(f"{key}: {value}" for key, value in (headers or {}).items()),
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
        **shown: Any,
    ) -> Exchange:
        """Send a request and show it: the curl command, then the answer shortened as
        ``shown`` says (``only``, ``hide``, ``items``: see ``render.Shortening``)."""
        exchange = self.call(method, path, body, headers=headers)
        self.show(exchange, **shown)
        return exchange

    def show(self, exchange: Exchange, *, curl: bool = True, **shown: Any) -> None:
        if curl:
            command = render.curl(
                exchange.method, exchange.path, exchange.body, headers=exchange.headers
            )
            self.chunks.append(f"```sh\n{command}\n```")
        if exchange.status >= 400:
            shown.setdefault("limit", None)  # an error's words are the point: all of them
        answer = self.shortened(exchange, **shown)
        self.chunks.append(render.answer_block(exchange.status, answer))

    def shortened(self, exchange: Exchange, **shown: Any) -> Any:
        names = {value: f"${variable}" for variable, value in self.variables.items()}
        return render.shorten(exchange.data, render.Shortening(names=names, **shown))

    def cell(self, exchange: Exchange, **shown: Any) -> str:
        """An answer in one table cell: its status and its JSON on one line, strings whole."""
        answer = self.shortened(exchange, limit=None, **shown)
        return f"{exchange.status} {render.table_cell(render.flat(answer))}"

    def _expand(self, path: str) -> str:
        # Longest names first: $CONV must not eat the start of $CONVERSATION.
        for variable in sorted(self.variables, key=len, reverse=True):
            path = path.replace(f"${variable}", self.variables[variable])
        return path


def _fold(paragraph: str) -> str:
    """A paragraph of prose as lines of at most ``render.PROSE_WIDTH``; code blocks,
    tables, headings and lists as they are."""
    if paragraph.startswith(("```", "|", "#", "- ")):
        return paragraph
    return textwrap.fill(
        " ".join(paragraph.split()),
        width=render.PROSE_WIDTH,
        break_long_words=False,
        break_on_hyphens=False,
    )


class ClaimFailed(AssertionError):
    """What the prose says about an answer is not what the server answered."""


def expect(condition: bool, claim: str) -> None:
    """Stop writing the page when a claim of its prose does not hold."""
    if not condition:
        raise ClaimFailed(claim)
