"""Summarizer backends: the OpenAI one over real HTTP against FakeOpenAI, the offline one,
``get_summarizer()`` and the backends' system checks."""

from __future__ import annotations

import html
import json
import socket
import threading
import time

import openai
import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxsum.exceptions import SummarizerError, SummaryTruncated
from ctxsum.summarizers import Summarizer, get_summarizer
from ctxsum.summarizers.base import BLANK_INPUT, BLANK_SUMMARY, E_UNKNOWN_OPTIONS
from ctxsum.summarizers.offline import OfflineSummarizer
from ctxsum.summarizers.openai import (
    CLIENT_FAILED,
    CONNECTION_FAILED,
    E_BAD_OPTION,
    HTTP_ERROR,
    MALFORMED_RESPONSE,
    NO_CHOICES,
    PLACEHOLDER_API_KEY,
    TIMED_OUT,
    W_NO_CREDENTIALS,
    MalformedResponse,
    OpenAISummarizer,
)
from ctxsum.tokens import count_text
from tests.factories import assistant_calls, tool_result, user_message
from tests.openai_server import fake_summary

PROMPT = "Summarize the conversation."
HISTORY = "<user>Book a table for 4 at Chez Paul on 12 May.</user>\n<assistant>Done.</assistant>"
# What the compaction service passes besides prompt and history; the budget is larger than
# any max_tokens here, so max_tokens is what bounds the offline summaries below.
CALL = {"model": "summary-model", "budget": 10**6}
OPENAI_PATH = "ctxsum.summarizers.openai.OpenAISummarizer"
OFFLINE_PATH = "ctxsum.summarizers.offline.OfflineSummarizer"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    # A proxy from the environment must not capture requests to the local fake.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def make_openai(base_url: str, **kwargs) -> OpenAISummarizer:
    options = {"base_url": base_url, "api_key": "test-key", **kwargs.pop("options", {})}
    config = {"model": "summary-model", "timeout": 5, "max_tokens": 321, **kwargs}
    return OpenAISummarizer(options=options, **config)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# --- OpenAI backend: requests ----------------------------------------------------------


def test_openai_sends_one_system_and_one_user_message(openai_server):
    summary = make_openai(openai_server.base_url).summarize(prompt=PROMPT, history=HISTORY, **CALL)

    assert summary == fake_summary(HISTORY)
    [request] = openai_server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer test-key"
    body = request["body"]
    assert body["messages"] == [
        {"role": "system", "content": PROMPT},
        {"role": "user", "content": HISTORY},
    ]
    assert body["model"] == "summary-model"
    # Current OpenAI models take only max_completion_tokens.
    assert body["max_completion_tokens"] == 321
    assert "max_tokens" not in body
    assert "temperature" not in body
    assert body.get("stream") in (None, False)


def test_openai_returns_stripped_content(openai_server):
    openai_server.reply = "\n  Alice booked LH123 for 12 May.  \n"

    summary = make_openai(openai_server.base_url).summarize(prompt=PROMPT, history=HISTORY, **CALL)

    assert summary == "Alice booked LH123 for 12 May."


def test_openai_sends_temperature_and_extra_body(openai_server):
    options = {"temperature": 0.2, "extra_body": {"top_k": 5}}

    make_openai(openai_server.base_url, options=options).summarize(
        prompt=PROMPT, history=HISTORY, **CALL
    )

    body = openai_server.requests[0]["body"]
    assert body["temperature"] == 0.2
    assert body["top_k"] == 5


def test_openai_sends_the_model_it_is_given_for_the_call(openai_server):
    make_openai(openai_server.base_url).summarize(
        prompt=PROMPT, history=HISTORY, model="gpt-4.1-nano", budget=50
    )

    assert openai_server.requests[0]["body"]["model"] == "gpt-4.1-nano"


def test_openai_max_tokens_param_option_for_older_servers(openai_server):
    summarizer = make_openai(openai_server.base_url, options={"max_tokens_param": "max_tokens"})

    summarizer.summarize(prompt=PROMPT, history=HISTORY, **CALL)

    body = openai_server.requests[0]["body"]
    assert body["max_tokens"] == 321
    assert "max_completion_tokens" not in body


@pytest.mark.parametrize("content", ["Alice booked LH123 for", None])
def test_openai_reply_cut_off_at_max_tokens_is_a_failure(openai_server, content):
    openai_server.reply = content
    openai_server.finish_reason = "length"

    with pytest.raises(SummaryTruncated, match="cut off at 321 tokens"):
        make_openai(openai_server.base_url).summarize(prompt=PROMPT, history=HISTORY, **CALL)


def test_openai_uses_a_placeholder_key_for_a_keyless_local_server(openai_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    summarizer = OpenAISummarizer(
        model="local", timeout=5, max_tokens=100, options={"base_url": openai_server.base_url}
    )

    summarizer.summarize(prompt=PROMPT, history=HISTORY, **CALL)

    auth = openai_server.requests[0]["headers"]["authorization"]
    assert auth == f"Bearer {PLACEHOLDER_API_KEY}"


def test_openai_reads_base_url_and_key_from_the_environment(openai_server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    summarizer = OpenAISummarizer(model="m", timeout=5, max_tokens=100)

    assert summarizer.summarize(prompt=PROMPT, history=HISTORY, **CALL) == fake_summary(HISTORY)
    assert openai_server.requests[0]["headers"]["authorization"] == "Bearer env-key"


def test_openai_creates_one_client_per_instance(openai_server):
    summarizer = make_openai(openai_server.base_url)

    summarizer.summarize(prompt=PROMPT, history=HISTORY, **CALL)
    client = summarizer.client
    summarizer.summarize(prompt=PROMPT, history=HISTORY, **CALL)

    assert summarizer.client is client
    assert client.max_retries == 0
    assert len(openai_server.requests) == 2


def test_openai_refuses_blank_history_without_calling(openai_server):
    summarizer = make_openai(openai_server.base_url)

    for history in ("", "  \n\t "):
        with pytest.raises(SummarizerError, match=BLANK_INPUT):
            summarizer.summarize(prompt=PROMPT, history=history, **CALL)

    assert openai_server.requests == []


# --- OpenAI backend: failures ----------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "message", "cause"),
    [
        ("error", HTTP_ERROR.format(status=500), openai.InternalServerError),
        ("blank", BLANK_SUMMARY, MalformedResponse),
        ("null", BLANK_SUMMARY, MalformedResponse),
        ("malformed", MALFORMED_RESPONSE, json.JSONDecodeError),
        ("text", MALFORMED_RESPONSE, MalformedResponse),
        ("no_choices", NO_CHOICES, MalformedResponse),
    ],
)
def test_openai_failure_is_one_attempt_and_one_error(openai_server, mode, message, cause):
    openai_server.mode = mode
    summarizer = make_openai(openai_server.base_url)

    with pytest.raises(SummarizerError) as caught:
        summarizer.summarize(prompt=PROMPT, history=HISTORY, **CALL)

    assert str(caught.value).startswith(message)
    assert isinstance(caught.value.cause, cause)
    assert len(openai_server.requests) == 1


def test_openai_http_error_names_status_and_server_message(openai_server):
    openai_server.mode = "error"
    openai_server.error_status = 503

    with pytest.raises(SummarizerError) as caught:
        make_openai(openai_server.base_url).summarize(prompt=PROMPT, history=HISTORY, **CALL)

    assert str(caught.value) == "The summarizer answered HTTP 503. The fake server had an error."
    assert isinstance(caught.value.cause, openai.APIStatusError)
    assert len(openai_server.requests) == 1


def test_openai_wrong_path_is_an_http_error(openai_server):
    base_url = openai_server.base_url.removesuffix("/v1")

    with pytest.raises(SummarizerError) as caught:
        make_openai(base_url).summarize(prompt=PROMPT, history=HISTORY, **CALL)

    assert str(caught.value).startswith(HTTP_ERROR.format(status=404))
    assert isinstance(caught.value.cause, openai.NotFoundError)


def test_openai_timeout_is_one_attempt(openai_server):
    openai_server.mode = "slow"
    openai_server.delay = 2
    summarizer = make_openai(openai_server.base_url, timeout=0.5)

    started = time.monotonic()
    with pytest.raises(SummarizerError) as caught:
        summarizer.summarize(prompt=PROMPT, history=HISTORY, **CALL)
    elapsed = time.monotonic() - started

    assert str(caught.value) == TIMED_OUT.format(timeout=0.5)
    assert str(caught.value) == "The summarizer timed out after 0.5s."
    assert isinstance(caught.value.cause, openai.APITimeoutError)
    assert elapsed < 1.8
    assert len(openai_server.requests) == 1


def test_openai_connection_refused():
    base_url = closed_port_url()

    with pytest.raises(SummarizerError) as caught:
        make_openai(base_url).summarize(prompt=PROMPT, history=HISTORY, **CALL)

    assert str(caught.value) == CONNECTION_FAILED.format(base_url=base_url + "/")
    assert isinstance(caught.value.cause, openai.APIConnectionError)
    assert not isinstance(caught.value.cause, openai.APITimeoutError)


def test_openai_without_any_credentials_fails_without_network(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    summarizer = OpenAISummarizer(model="m", timeout=5, max_tokens=100)

    with pytest.raises(SummarizerError) as caught:
        summarizer.summarize(prompt=PROMPT, history=HISTORY, **CALL)

    assert str(caught.value).startswith(CLIENT_FAILED)
    assert isinstance(caught.value.cause, openai.OpenAIError)


def test_fake_server_answers_while_a_slow_call_is_in_flight(openai_server):
    openai_server.mode = "slow"
    openai_server.delay = 2
    results: list[str] = []
    slow = threading.Thread(
        target=lambda: results.append(
            make_openai(openai_server.base_url).summarize(prompt=PROMPT, history="slow", **CALL)
        )
    )
    slow.start()
    assert openai_server.wait_for_requests(1)
    assert openai_server.in_flight == 1
    openai_server.mode = "ok"

    started = time.monotonic()
    fast = make_openai(openai_server.base_url).summarize(prompt=PROMPT, history="fast", **CALL)
    assert time.monotonic() - started < 1
    assert fast == fake_summary("fast")
    assert openai_server.wait_for_in_flight(1)

    slow.join(timeout=5)
    assert results == [fake_summary("slow")]
    assert openai_server.wait_for_in_flight(0)


# --- Offline backend --------------------------------------------------------------------

SAMPLE = "\n".join(
    [
        "<system>You are a travel agent.</system>",
        "<user>Hi there!</user>",
        "<assistant>Hello! How can I help?</assistant>",
        "<user>I&#x27;m Alice Martin. I need a flight from Berlin to Lisbon on 12 May 2025, "
        "budget 400 EUR.</user>",
        '<assistant>Let me look.<tool-call id="call-1" name="search_flights">'
        "{&quot;from&quot;: &quot;BER&quot;, &quot;to&quot;: &quot;LIS&quot;}</tool-call>"
        "</assistant>",
        '<tool-result id="call-1" name="search_flights">TP 537 at 09:40 for 312 EUR; '
        "LH 1172 at 14:05 for 389 EUR.</tool-result>",
        "<assistant>There are two options. TP 537 is cheaper.</assistant>",
        "<user>Great, let&#x27;s go with that. Seat by the window please.</user>",
        "<assistant>Booked: TP 537 on 12 May 2025, booking code QX7R2M, seat 14A. "
        "You agreed to pay by card &amp; I will email the receipt.</assistant>",
        "<user>Thanks, that&#x27;s all.</user>",
    ]
)


def offline(max_tokens: int = 1024) -> OfflineSummarizer:
    return OfflineSummarizer(model="gpt-4o-mini", timeout=60, max_tokens=max_tokens)


def test_offline_capabilities():
    assert OfflineSummarizer.requires_network is False
    assert OfflineSummarizer.deterministic is True
    assert OpenAISummarizer.requires_network is True
    assert OpenAISummarizer.deterministic is False
    assert offline().check() == []


def test_offline_is_deterministic():
    first = offline().summarize(prompt=PROMPT, history=SAMPLE, **CALL)

    assert offline().summarize(prompt="another prompt", history=SAMPLE, **CALL) == first
    assert offline().summarize(prompt=PROMPT, history=SAMPLE, **CALL) == first


def test_offline_keeps_facts_and_drops_small_talk():
    summary = offline().summarize(prompt=PROMPT, history=SAMPLE, **CALL)

    for fact in (
        "Alice Martin",
        "Berlin to Lisbon on 12 May 2025",
        "400 EUR",
        "QX7R2M",
        "seat 14A",
        "You agreed to pay by card & I will email the receipt.",
        "TP 537 at 09:40 for 312 EUR",
        'search_flights({"from": "BER", "to": "LIS"})',
    ):
        assert fact in summary
    for chatter in ("Hi there", "How can I help", "that's all", "Let me look", "&amp;", "&quot;"):
        assert chatter not in summary
    assert summary == summary.strip()


def test_offline_output_is_ordered_and_labelled():
    lines = offline().summarize(prompt=PROMPT, history=SAMPLE, **CALL).splitlines()

    assert lines[0].startswith("- User: I'm Alice Martin.")
    assert lines[1] == '- Called search_flights({"from": "BER", "to": "LIS"})'
    assert lines[2].startswith("- search_flights returned: TP 537")
    assert "- User: Great, let's go with that. Seat by the window please." in lines
    assert lines[-1].startswith("- Assistant: Booked: TP 537")


def test_offline_stays_within_budget():
    history = "\n".join(
        f"<user>Order {n} ships to Warehouse {n % 7} on day {n}.</user>" for n in range(200)
    )

    summary = offline(max_tokens=60).summarize(prompt=PROMPT, history=history, **CALL)

    assert 0 < count_text(summary) <= 60
    # The newest facts are kept, the oldest dropped.
    assert "Order 199 ships" in summary
    assert "Order 0 ships" not in summary


def test_offline_truncates_a_single_huge_sentence():
    history = "<user>" + " ".join(f"item{n}" for n in range(2000)) + "</user>"

    summary = offline(max_tokens=20).summarize(prompt=PROMPT, history=history, **CALL)

    assert summary.startswith("- User: item0")
    assert 0 < count_text(summary) <= 20


def test_offline_never_blank_without_facts():
    history = "<user>hello there. how are you?</user><assistant>fine, thanks.</assistant>"

    assert offline().summarize(prompt=PROMPT, history=history, **CALL) == "- User: hello there."


def test_offline_refuses_blank_input():
    for history in ("", "   \n ", "<user></user>"):
        with pytest.raises(SummarizerError, match=BLANK_INPUT):
            offline().summarize(prompt=PROMPT, history=history, **CALL)


def test_offline_accepts_plain_text():
    summary = offline().summarize(prompt=PROMPT, history="Meeting moved to Friday 3pm.", **CALL)

    assert "Meeting moved to Friday 3pm." in summary


def test_offline_keeps_previous_summary_and_appends_new_facts():
    previous = offline().summarize(prompt=PROMPT, history=SAMPLE, **CALL)
    history = (
        f"<summary-so-far>{previous.replace('&', '&amp;')}</summary-so-far>\n"
        "<user>Please add checked baggage, 23 kg.</user>"
    )

    summary = offline().summarize(prompt=PROMPT, history=history, **CALL)

    assert summary.startswith(previous)
    assert summary.endswith("- User: Please add checked baggage, 23 kg.")


def test_offline_trims_previous_summary_from_the_oldest_part():
    previous = "\n".join(f"Fact {n}: invoice {1000 + n} is paid." for n in range(100))
    history = f"<summary-so-far>{previous}</summary-so-far><user>Refund 2 EUR to Bob.</user>"

    summary = offline(max_tokens=80).summarize(prompt=PROMPT, history=history, **CALL)

    assert count_text(summary) <= 80
    assert "Fact 0:" not in summary
    assert "Fact 99: invoice 1099 is paid." in summary
    assert summary.endswith("- User: Refund 2 EUR to Bob.")


def test_offline_reads_the_formatter_output():
    from ctxsum.formatting import format_messages, with_summary_so_far

    messages = [
        user_message("Ship order #4411 to <Oslo> & tell Ingrid."),
        assistant_calls("c1", name="ship", arguments='{"order": 4411}'),
        tool_result("c1", "Shipped, tracking ZX-99."),
    ]
    history = with_summary_so_far("Earlier: Ingrid is the customer.", format_messages(messages))

    summary = offline().summarize(prompt=PROMPT, history=history, **CALL)

    assert summary.splitlines() == [
        "Earlier: Ingrid is the customer.",
        "- User: Ship order #4411 to <Oslo> & tell Ingrid.",
        '- Called ship({"order": 4411})',
        "- ship returned: Shipped, tracking ZX-99.",
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(min_size=1, max_size=400), max_tokens=st.integers(1, 80))
def test_offline_never_blank_and_within_budget(text, max_tokens):
    history = f"<user>{html.escape(text, quote=False)}</user>"
    summarizer = offline(max_tokens)
    if not text.strip():
        with pytest.raises(SummarizerError):
            summarizer.summarize(prompt=PROMPT, history=history, **CALL)
        return

    summary = summarizer.summarize(prompt=PROMPT, history=history, **CALL)

    assert summary.strip()
    assert count_text(summary) <= max_tokens


# --- get_summarizer -------------------------------------------------------------------


def test_get_summarizer_builds_the_configured_backend():
    config = {
        "SUMMARIZER": OPENAI_PATH,
        "SUMMARY_MODEL": "m1",
        "SUMMARY_TIMEOUT": 7,
        "SUMMARY_MAX_TOKENS": 99,
        "SUMMARIZER_OPTIONS": {"base_url": "http://127.0.0.1:9/v1", "api_key": "k"},
    }
    with override_settings(CTXSUM=config):
        summarizer = get_summarizer()

        assert isinstance(summarizer, OpenAISummarizer)
        assert isinstance(summarizer, Summarizer)
        assert (summarizer.model, summarizer.timeout, summarizer.max_tokens) == ("m1", 7, 99)
        assert summarizer.options == config["SUMMARIZER_OPTIONS"]


def test_get_summarizer_is_cached_and_rebuilt_on_override():
    with override_settings(CTXSUM={"SUMMARIZER": OFFLINE_PATH, "SUMMARY_MODEL": "a"}):
        first = get_summarizer()
        assert get_summarizer() is first
        assert isinstance(first, OfflineSummarizer)

        with override_settings(CTXSUM={"SUMMARIZER": OFFLINE_PATH, "SUMMARY_MODEL": "b"}):
            second = get_summarizer()
            assert second is not first
            assert second.model == "b"
            assert get_summarizer() is second

        assert get_summarizer().model == "a"

    with override_settings(CTXSUM={"SUMMARIZER": OPENAI_PATH, "SUMMARIZER_OPTIONS": {}}):
        assert isinstance(get_summarizer(), OpenAISummarizer)


def test_get_summarizer_keeps_the_openai_client(openai_server):
    options = {"base_url": openai_server.base_url, "api_key": "k"}
    with override_settings(CTXSUM={"SUMMARIZER": OPENAI_PATH, "SUMMARIZER_OPTIONS": options}):
        get_summarizer().summarize(prompt=PROMPT, history=HISTORY, **CALL)
        client = get_summarizer().client
        get_summarizer().summarize(prompt=PROMPT, history=HISTORY, **CALL)

        assert get_summarizer().client is client
    assert len(openai_server.requests) == 2


# --- check() -----------------------------------------------------------------------------


def check_ids(summarizer: Summarizer) -> list[str]:
    return [message.id for message in summarizer.check()]


def test_check_passes_a_good_configuration():
    summarizer = OpenAISummarizer(model="m", timeout=60, max_tokens=100, options={"api_key": "k"})

    assert summarizer.check() == []


def test_check_blank_model_is_fine_it_means_the_conversations_model():
    summarizer = OpenAISummarizer(model="", timeout=60, max_tokens=100, options={"api_key": "k"})

    assert summarizer.check() == []


def test_check_unknown_max_tokens_param_is_an_error():
    options = {"api_key": "k", "max_tokens_param": "max_output_tokens"}

    ids = check_ids(OpenAISummarizer(model="m", timeout=60, max_tokens=100, options=options))

    assert ids == [E_BAD_OPTION]


def test_check_no_key_and_no_base_url_is_a_warning(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    [warning] = OpenAISummarizer(model="m", timeout=60, max_tokens=100).check()
    assert warning.id == W_NO_CREDENTIALS == "ctxsum.W010"
    assert not warning.is_serious()

    local = OpenAISummarizer(
        model="m", timeout=60, max_tokens=100, options={"base_url": "http://localhost:8000/v1"}
    )
    assert local.check() == []
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    assert OpenAISummarizer(model="m", timeout=60, max_tokens=100).check() == []


def test_check_unknown_and_mistyped_options_are_errors():
    options = {"api_key": "k", "base_uri": "x", "temperature": "hot", "extra_body": ["a"]}

    ids = check_ids(OpenAISummarizer(model="m", timeout=60, max_tokens=100, options=options))

    assert ids == [E_UNKNOWN_OPTIONS, E_BAD_OPTION, E_BAD_OPTION]
