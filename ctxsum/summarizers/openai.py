"""The OpenAI-compatible summarizer: one chat completion against any base URL.

Works with OpenAI, Azure's OpenAI-compatible endpoint, vLLM, Ollama, llama.cpp and anything
else that speaks ``POST /v1/chat/completions``. Beside ``ctxsum.chat.client`` (the chat turn's
client) this is the only module importing ``openai``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import replace
from numbers import Real
from typing import Any, ClassVar, TypeVar, overload

import openai
from django.core import checks

from ctxsum.exceptions import FailureCause, SummarizerError, SummaryTruncated
from ctxsum.hooks import summary_facts_wanted
from ctxsum.summarizers import facts as fact_parse
from ctxsum.summarizers.base import BLANK_SUMMARY, Summarizer, SummaryAnswer
from ctxsum.summarizers.facts import ASKED_FACTS

# Every option this backend takes, with the types its value may have.
_OPTION_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "base_url": ((str,), "a string"),
    "api_key": ((str,), "a string"),
    "temperature": ((Real,), "a number"),
    "extra_body": ((Mapping,), "a dict"),
    "max_tokens_param": ((str,), "a string"),
    "facts_format": ((str,), "a string"),
}
OPTIONS = frozenset(_OPTION_TYPES)
# How the request names the answer's token cap: current OpenAI models take only
# max_completion_tokens; some older OpenAI-compatible servers only max_tokens.
MAX_TOKENS_PARAMS = ("max_completion_tokens", "max_tokens")
# How the answer carries the key facts: "json_schema" asks for structured output
# (response_format, a JSON object with the summary and the facts; OpenAI, vLLM, Ollama,
# llama.cpp and others support it), "tagged" for a <facts> JSON block after the summary
# (any server), "off" for none.
FACTS_FORMATS = ("json_schema", "tagged", "off")
_OPTION_CHOICES = {"max_tokens_param": MAX_TOKENS_PARAMS, "facts_format": FACTS_FORMATS}
DEFAULT_FACTS_FORMAT = "tagged"
# The facts_format when no installed app takes key facts (ctxsum.hooks.summary_facts_wanted).
NOT_ASKED = ""
# Local servers (vLLM, Ollama, llama.cpp) ignore the key, but the client insists on one.
PLACEHOLDER_API_KEY = "not-needed"

TIMED_OUT = "The summarizer timed out after {timeout:g}s."
HTTP_ERROR = "The summarizer answered HTTP {status}."
CONNECTION_FAILED = "Could not connect to the summarizer at {base_url}."
MALFORMED_RESPONSE = "The summarizer returned a malformed response."
NO_CHOICES = "The summarizer returned no choices."
NO_MESSAGE = "The summarizer returned a choice without a message."
CLIENT_FAILED = "The OpenAI client could not be created."
CALL_FAILED = "The summarizer call failed."
# What a provider's error status means for the client (FailureCause); any other status is
# a provider_error.
STATUS_CAUSES = {
    401: FailureCause.UNAUTHORIZED,
    403: FailureCause.UNAUTHORIZED,
    429: FailureCause.RATE_LIMITED,
}
TRUNCATED = (
    "The summary was cut off at {max_tokens} tokens (finish_reason: length); raise "
    "SUMMARY_MAX_TOKENS."
)
NOT_AN_ANSWER = "The summarizer's answer is not the JSON object asked for (summary and facts)."
ONLY_FACTS = "The summarizer's answer holds key facts but no summary."
FACTS_OFF = "Key facts are off (SUMMARIZER_OPTIONS['facts_format'] is 'off')."

# What the prompt adds for each facts format (after PROMPT, before the length budget).
_FACTS_WHAT = (
    "the key facts of the messages that the assistant will need later: identifiers, codes, "
    'amounts, dates, e-mail addresses, names and preferences. Each fact has a "key", a '
    'short snake_case name of what it is (order_id, email, delivery_date), a "value", '
    'the fact as the messages state it, and "source_seqs", the seq attributes of the '
    "messages it comes from. Only facts that the messages tagged with a seq state, not "
    f"those of the summary so far; at most {ASKED_FACTS}, the latest ones."
)
FACTS_INSTRUCTIONS = {
    "tagged": (
        "After the summary, write <facts>, a JSON array of "
        '{"key": …, "value": …, "source_seqs": […]} objects, then </facts>: '
        + _FACTS_WHAT
        + " Write <facts>[]</facts> when there are none."
    ),
    "json_schema": (
        'Answer with a JSON object: "summary" holds the summary, and "facts" lists ' + _FACTS_WHAT
    ),
    "off": "",
}
# Structured output: OpenAI's strict mode wants every property required and no others.
FACTS_SCHEMA: dict[str, Any] = {
    "name": "summary_with_facts",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {
            "summary": {"type": "string"},
            "facts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "key": {"type": "string"},
                        "value": {"type": "string"},
                        "source_seqs": {"type": "array", "items": {"type": "integer"}},
                    },
                    "required": ["key", "value", "source_seqs"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["summary", "facts"],
        "additionalProperties": False,
    },
}

E_BAD_OPTION = "ctxsum.E012"
W_NO_CREDENTIALS = "ctxsum.W010"
BAD_OPTION = "SUMMARIZER_OPTIONS[{name!r}] must be {expected}."
NO_CREDENTIALS = "The OpenAI summarizer has no API key and no base URL."
NO_CREDENTIALS_HINT = (
    "Set OPENAI_API_KEY, or SUMMARIZER_OPTIONS['api_key'], or point "
    "SUMMARIZER_OPTIONS['base_url'] (or OPENAI_BASE_URL) at a local server."
)

_DETAIL_CHARS = 200
C = TypeVar("C", openai.OpenAI, openai.AsyncOpenAI)


class OpenAISummarizer(Summarizer):
    """Summarizes with one ``chat.completions.create`` call: the prompt as the system
    message, the history as one user message. The client's own retries are off: one attempt.

    Options: ``base_url`` and ``api_key`` (default: ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``),
    ``temperature``, ``extra_body`` (extra JSON fields, e.g. for vLLM), ``max_tokens_param``
    (one of ``MAX_TOKENS_PARAMS``), ``facts_format`` (one of ``FACTS_FORMATS``, default
    ``"tagged"``).
    """

    _client: openai.OpenAI | None = None
    # Held only while an instance creates its client, so one lock serves every instance.
    _client_lock: ClassVar[threading.Lock] = threading.Lock()

    @property
    def client(self) -> openai.OpenAI:
        """The instance's one client, created on first use: building it with no credentials
        raises, and system checks must be able to inspect a misconfigured backend."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    try:
                        self._client = openai_client(self.options, timeout=self.timeout)
                    except openai.OpenAIError as exc:
                        raise SummarizerError(f"{CLIENT_FAILED} {exc}", cause=exc) from exc
        return self._client

    @property
    def facts_format(self) -> str:
        """How the answer carries the key facts; ``NOT_ASKED`` when no installed app takes
        them (the prompt asks for none, and nothing is said about them)."""
        if not summary_facts_wanted():
            return NOT_ASKED
        if self._plain:
            return "off"
        return self.options.get("facts_format") or DEFAULT_FACTS_FORMAT

    @property
    def _plain(self) -> bool:
        """A subclass that overrides ``summarize()`` and not ``answer()`` returns plain
        summaries: its facts are skipped, and its prompt does not ask for any."""
        overridden = type(self).summarize is not OpenAISummarizer.summarize
        return overridden and type(self).answer is OpenAISummarizer.answer

    def facts_instruction(self) -> str:
        return FACTS_INSTRUCTIONS.get(self.facts_format, "")

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        return self._call(prompt=prompt, history=history, model=model, budget=budget).summary

    def answer(self, *, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        """One call; its answer split into the summary and the key facts by
        ``facts_format``. Facts that cannot be parsed are skipped with the reason; the
        summary stands."""
        if self._plain:
            return super().answer(prompt=prompt, history=history, model=model, budget=budget)
        return self._call(prompt=prompt, history=history, model=model, budget=budget)

    async def aanswer(self, *, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        """``answer()`` through ``openai.AsyncOpenAI``: the same request and answer."""
        if self._plain:
            return await super().aanswer(prompt=prompt, history=history, model=model, budget=budget)
        self.require_history(history)
        client, facts_format = self._aclient(), self.facts_format
        try:
            create: Any = client.chat.completions.create
            response = await create(**self._request(prompt, history, model, facts_format))
        except Exception as exc:
            failure = self._failure(exc, client)
            if failure is None:
                raise
            raise failure from exc
        return _answered(response, max_tokens=self.max_tokens, facts_format=facts_format)

    def _call(self, *, prompt: str, history: str, model: str, budget: int) -> SummaryAnswer:
        self.require_history(history)
        client, facts_format = self.client, self.facts_format
        try:
            create: Any = client.chat.completions.create
            response = create(**self._request(prompt, history, model, facts_format))
        except Exception as exc:
            failure = self._failure(exc, client)
            if failure is None:
                raise
            raise failure from exc
        return _answered(response, max_tokens=self.max_tokens, facts_format=facts_format)

    def _aclient(self) -> openai.AsyncOpenAI:
        """The instance's async client for the running event loop: a client's connections
        belong to the loop that opened them."""
        clients = self.__dict__.setdefault("_aclients", weakref.WeakKeyDictionary())
        loop = asyncio.get_running_loop()
        if loop not in clients:
            try:
                clients[loop] = openai_client(
                    self.options, timeout=self.timeout, client_class=openai.AsyncOpenAI
                )
            except openai.OpenAIError as exc:
                raise SummarizerError(f"{CLIENT_FAILED} {exc}", cause=exc) from exc
        client: openai.AsyncOpenAI = clients[loop]
        return client

    def _request(self, prompt: str, history: str, model: str, facts_format: str) -> dict[str, Any]:
        """The keyword arguments of the call's ``chat.completions.create``."""
        limit = self.options.get("max_tokens_param") or MAX_TOKENS_PARAMS[0]
        extra: dict[str, Any] = {limit: self.max_tokens}
        if self.options.get("temperature") is not None:
            extra["temperature"] = self.options["temperature"]
        if self.options.get("extra_body"):
            extra["extra_body"] = dict(self.options["extra_body"])
        if facts_format == "json_schema":
            extra["response_format"] = {"type": "json_schema", "json_schema": FACTS_SCHEMA}
        messages = [{"role": "system", "content": prompt}, {"role": "user", "content": history}]
        return {"model": model, "messages": messages, **extra}

    def _failure(
        self, exc: Exception, client: openai.OpenAI | openai.AsyncOpenAI
    ) -> SummarizerError | None:
        """The SummarizerError saying what the call's ``exc`` means; None when it is not the
        client's (it propagates as it is)."""
        # APITimeoutError is an APIConnectionError: it must come first.
        if isinstance(exc, openai.APITimeoutError):
            message = TIMED_OUT.format(timeout=float(self.timeout))
            return SummarizerError(message, cause=exc, kind=FailureCause.TIMEOUT)
        if isinstance(exc, openai.APIConnectionError):
            # Userinfo in a base URL would be a credential: keep it out of the message.
            base_url = client.base_url.copy_with(userinfo=b"")
            message = CONNECTION_FAILED.format(base_url=base_url)
            return SummarizerError(message, cause=exc, kind=FailureCause.UNREACHABLE)
        if isinstance(exc, openai.APIStatusError):
            message = HTTP_ERROR.format(status=exc.status_code)
            detail = error_detail(exc.body)
            kind = STATUS_CAUSES.get(exc.status_code, FailureCause.PROVIDER_ERROR)
            message = f"{message} {detail}" if detail else message
            return SummarizerError(message, cause=exc, kind=kind)
        if isinstance(exc, openai.APIResponseValidationError | ValueError | RecursionError):
            # A 200 whose JSON body does not parse surfaces as json.JSONDecodeError, one
            # nested deeper than the parser recurses as RecursionError.
            return SummarizerError(MALFORMED_RESPONSE, cause=exc, kind=FailureCause.BAD_ANSWER)
        if isinstance(exc, openai.OpenAIError):
            return SummarizerError(f"{CALL_FAILED} {exc}", cause=exc)
        return None

    def check(self) -> list[checks.CheckMessage]:
        obj = self.dotted_path()
        wrong: list[tuple[str, str]] = []  # each option of the wrong type, or not one allowed
        for name, (types, expected) in _OPTION_TYPES.items():
            value = self.options.get(name)
            if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
                wrong.append((name, expected))
        for name, allowed in _OPTION_CHOICES.items():
            value = self.options.get(name)
            if isinstance(value, str) and value not in allowed:
                wrong.append((name, " or ".join(repr(choice) for choice in allowed)))
        errors = self.unknown_options(OPTIONS) + [
            checks.Error(BAD_OPTION.format(name=name, expected=expected), obj=obj, id=E_BAD_OPTION)
            for name, expected in wrong
        ]
        has_key = self.options.get("api_key") or os.environ.get("OPENAI_API_KEY")
        has_base_url = self.options.get("base_url") or os.environ.get("OPENAI_BASE_URL")
        if not has_key and not has_base_url:
            warning = checks.Warning(
                NO_CREDENTIALS, hint=NO_CREDENTIALS_HINT, obj=obj, id=W_NO_CREDENTIALS
            )
            errors.append(warning)
        return errors


@overload
def openai_client(options: Mapping[str, Any], *, timeout: float) -> openai.OpenAI: ...
@overload
def openai_client(options: Mapping[str, Any], *, timeout: float, client_class: type[C]) -> C: ...
def openai_client(
    options: Mapping[str, Any], *, timeout: float, client_class: type[Any] = openai.OpenAI
) -> Any:
    """A client (``client_class``: ``openai.OpenAI`` or ``openai.AsyncOpenAI``) of
    ``options``' ``base_url`` and ``api_key`` (else OPENAI_BASE_URL and OPENAI_API_KEY) that
    makes one attempt per call: the callers retry, if at all. Raises openai.OpenAIError."""
    base_url = options.get("base_url") or None
    api_key = options.get("api_key") or None
    has_base_url = base_url or os.environ.get("OPENAI_BASE_URL")
    if api_key is None and not os.environ.get("OPENAI_API_KEY") and has_base_url:
        api_key = PLACEHOLDER_API_KEY
    return client_class(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)


class MalformedResponse(ValueError):
    """What exactly was wrong with a response that parsed: the ``cause`` of the error."""


def _answered(response: Any, *, max_tokens: int, facts_format: str) -> SummaryAnswer:
    """``_answer``, with the model the response names: the one that ran (a dated snapshot,
    say, or what a router chose), as the provider reports it."""
    answer = _answer(response, max_tokens=max_tokens, facts_format=facts_format)
    reported = getattr(response, "model", None)
    if not isinstance(reported, str) or not reported.strip():
        return answer
    return replace(answer, model=reported.strip())


def _answer(response: Any, *, max_tokens: int, facts_format: str) -> SummaryAnswer:
    """The summary and key facts of the first choice. A reply cut off at ``max_tokens`` is
    an error, unless the summary was complete and only the facts after it were cut off;
    a blank summary, or a structured answer without one, is an error.

    The client does not validate responses: a non-JSON body with a non-JSON content type
    comes back as a ``str``, a JSON ``null`` as ``None``, missing fields as missing attributes.
    """

    def fail(message: str, detail: str) -> SummarizerError:
        return SummarizerError(
            message, cause=MalformedResponse(detail), kind=FailureCause.BAD_ANSWER
        )

    if response is None or isinstance(response, str | bytes):
        raise fail(MALFORMED_RESPONSE, f"The body is not a chat completion: {response!r:.200}")
    choices = getattr(response, "choices", None)
    if choices is None:
        raise fail(MALFORMED_RESPONSE, f"The completion has no choices: {response!r:.200}")
    if not isinstance(choices, list) or not choices:
        raise fail(NO_CHOICES, f"choices is {choices!r:.200}")
    choice = choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        raise fail(NO_MESSAGE, f"The first choice has no message: {choice!r:.200}")
    content = getattr(message, "content", None)
    text = content if isinstance(content, str) else ""
    if getattr(choice, "finish_reason", None) == "length":
        # A reasoning model may even spend the whole cap before writing anything.
        salvaged = _salvaged(text, facts_format)
        if salvaged is None:
            raise SummaryTruncated(TRUNCATED.format(max_tokens=max_tokens))
        return SummaryAnswer(summary=salvaged, facts_skipped=(fact_parse.CUT_OFF,))
    if not text.strip():
        refusal = getattr(message, "refusal", None)
        detail = f"content is {content!r:.200}"
        if refusal:
            detail += f", refusal: {refusal!r:.200}"
        raise fail(BLANK_SUMMARY, detail)
    if facts_format == "tagged":
        summary, raw, problem = fact_parse.split_tagged(text)
        if not summary:
            raise fail(ONLY_FACTS, f"content is {content!r:.200}")
        parsed = fact_parse.facts_from_text(raw) if raw is not None else None
        if parsed is None:
            return SummaryAnswer(summary=summary, facts_skipped=(problem,))
        return SummaryAnswer(summary=summary, facts=parsed.facts, facts_skipped=parsed.skipped)
    if facts_format == "json_schema":
        structured, parsed = fact_parse.structured_answer(text)
        if structured is None:
            raise fail(NOT_AN_ANSWER, f"content is {content!r:.200}")
        return SummaryAnswer(summary=structured, facts=parsed.facts, facts_skipped=parsed.skipped)
    return SummaryAnswer(summary=text.strip(), facts_skipped=(FACTS_OFF,) if facts_format else ())


def _salvaged(text: str, facts_format: str) -> str | None:
    """The summary of an answer cut off at the token cap, when only its facts were cut."""
    if facts_format == "tagged" and fact_parse.OPEN_TAG in text:
        return fact_parse.split_tagged(text)[0] or None
    if facts_format == "json_schema":
        return fact_parse.salvaged_summary(text)
    return None


def error_detail(body: Any) -> str:
    """The server's own error message in an error answer's ``body``, shortened, so
    operators can tell a 401 from a 404 (the chat turn's errors use it too)."""
    if isinstance(body, Mapping):
        body = body.get("error", body)
    if isinstance(body, Mapping):
        body = body.get("message")
    if not isinstance(body, str):
        return ""
    detail = " ".join(body.split())
    return detail[:_DETAIL_CHARS] + ("…" if len(detail) > _DETAIL_CHARS else "")
