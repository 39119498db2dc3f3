"""ctxsum.tokens: tiktoken's own counts, the model's encoding, OpenAI's per-message accounting,
and the counts stored with appended messages."""

from __future__ import annotations

import pytest
import tiktoken
from django.db.models import Sum
from django.test import override_settings

from ctxsum import tokens
from ctxsum.models import Message
from ctxsum.selectors import context_get
from ctxsum.services import conversation_create, message_append
from tests.factories import (
    assistant_calls,
    assistant_message,
    tool_call,
    tool_result,
    user_message,
)

ENCODINGS = ("o200k_base", "cl100k_base")
SAMPLES = (
    "Hello, world!",
    "Book a flight from Zürich to São Paulo on 2025-03-14 for 2 adults, €1,234.50 max.",
    "def f(x):\n    return {'a': [1, 2, 3]}  # 日本語のコメント 🚀",
    "",
)


def ids(name: str, text: str) -> list[int]:
    return tiktoken.get_encoding(name).encode(text)


def n(name: str, text: str) -> int:
    return len(ids(name, text))


# --- raw counts ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("text", SAMPLES)
def test_count_text_equals_tiktoken(name: str, text: str) -> None:
    with override_settings(CTXSUM={"ENCODING": name}):
        assert tokens.count_text(text) == n(name, text)


def test_the_two_encodings_differ_on_the_samples() -> None:
    # Otherwise the tests below could not tell which encoding was used.
    text = SAMPLES[2]
    assert n("o200k_base", text) != n("cl100k_base", text)


def test_special_token_text_is_counted_as_plain_text_not_refused() -> None:
    text = "ignore <|endoftext|> this"
    encoding = tiktoken.get_encoding("o200k_base")
    with pytest.raises(ValueError):
        encoding.encode(text)  # tiktoken's default refuses special tokens
    expected = len(encoding.encode(text, disallowed_special=()))
    assert tokens.count_text(text, model="gpt-4o") == expected
    assert expected > 1


# --- which encoding -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("surely-not-a-model-7b", "o200k_base"),
    ],
)
def test_encoding_for_model(model: str, name: str) -> None:
    assert tokens.encoding_for(model).name == name
    assert tokens.count_text(SAMPLES[2], model=model) == n(name, SAMPLES[2])


def test_no_model_uses_the_default_model_setting() -> None:
    with override_settings(CTXSUM={"DEFAULT_MODEL": "gpt-4"}):
        assert tokens.encoding_for(None).name == "cl100k_base"
    with override_settings(CTXSUM={"DEFAULT_MODEL": "gpt-4o"}):
        assert tokens.encoding_for(None).name == "o200k_base"


def test_encoding_setting_overrides_the_model() -> None:
    with override_settings(CTXSUM={"ENCODING": "cl100k_base"}):
        assert tokens.encoding_for("gpt-4o").name == "cl100k_base"
        assert tokens.count_text(SAMPLES[2], model="gpt-4o") == n("cl100k_base", SAMPLES[2])
    with override_settings(CTXSUM={"ENCODING": "o200k_base"}):
        assert tokens.encoding_for("gpt-4").name == "o200k_base"
    # and back to the model's own once the override is gone
    assert tokens.encoding_for("gpt-4").name == "cl100k_base"


def test_encoding_is_loaded_once() -> None:
    assert tokens.get_encoding("o200k_base") is tokens.get_encoding("o200k_base")
    assert tokens.encoding_for("gpt-4o") is tokens.encoding_for("gpt-4o-mini")
    assert tokens.encoding_for("gpt-4") is tokens.get_encoding("cl100k_base")
    before = tokens.get_encoding.cache_info().hits
    tokens.count_message({"role": "user", "content": "hi"}, model="gpt-4o")
    assert tokens.get_encoding.cache_info().hits > before


# --- OpenAI's per-message accounting ------------------------------------------------------


@pytest.mark.parametrize(("model", "name"), [("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base")])
def test_worked_example_three_message_request(model: str, name: str) -> None:
    system = {"role": "system", "content": "You are a terse travel assistant."}
    user = {"role": "user", "name": "alice_smith", "content": "Find me a hotel in Lisbon."}
    assistant = {"role": "assistant", "content": "Three hotels near Baixa: A, B and C."}

    # By hand, from tiktoken encodings of each part (OpenAI cookbook: 3 tokens per message,
    # role and content tokens, 1 more plus the name's tokens for a name, 3 to prime the reply).
    expected_system = 3 + n(name, "system") + n(name, system["content"])
    expected_user = 3 + n(name, "user") + n(name, user["content"]) + 1 + n(name, "alice_smith")
    expected_assistant = 3 + n(name, "assistant") + n(name, assistant["content"])
    expected_request = expected_system + expected_user + expected_assistant + 3

    counts = [tokens.count_message(m, model=model) for m in (system, user, assistant)]
    assert counts == [expected_system, expected_user, expected_assistant]
    assert tokens.context_tokens(counts) == expected_request
    # The name really costs something: the same message without it is cheaper.
    unnamed = {"role": "user", "content": user["content"]}
    assert tokens.count_message(unnamed, model=model) == expected_user - 1 - n(name, "alice_smith")


def test_context_tokens_adds_reply_priming_once() -> None:
    assert tokens.context_tokens([]) == 3
    assert tokens.context_tokens([10, 20, 5]) == 38


def test_tool_calls_and_tool_results_are_counted() -> None:
    name = "o200k_base"
    arguments = '{"city": "Lisbon", "nights": 3, "max_price_eur": 180}'
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            tool_call("call_abc123", "search_hotels", arguments),
            tool_call("call_def456", "get_weather", '{"city": "Lisbon"}'),
        ],
    }
    expected = (
        3
        + n(name, "assistant")
        + (3 + n(name, "search_hotels") + n(name, arguments))
        + (3 + n(name, "get_weather") + n(name, '{"city": "Lisbon"}'))
    )
    assert tokens.count_message(call, model="gpt-4o") == expected

    result = tool_result("call_abc123", '[{"name": "A"}]')
    expected_result = 3 + n(name, "tool") + n(name, '[{"name": "A"}]') + n(name, "call_abc123")
    assert tokens.count_message(result, model="gpt-4o") == expected_result


def test_content_parts_text_and_image_estimates() -> None:
    name = "o200k_base"

    def image(detail: str | None) -> dict:
        body = {"url": "https://example.com/a.png"}
        if detail:
            body["detail"] = detail
        return {"type": "image_url", "image_url": body}

    def message(*parts: dict) -> dict:
        return {"role": "user", "content": list(parts)}

    text = {"type": "text", "text": "What is in this picture?"}
    base = 3 + n(name, "user")
    assert tokens.count_message(message(text), model="gpt-4o") == base + n(
        name, "What is in this picture?"
    )
    assert tokens.count_message(message(image("low")), model="gpt-4o") == base + 85
    assert tokens.count_message(message(image("high")), model="gpt-4o") == base + 765
    assert tokens.count_message(message(image("auto")), model="gpt-4o") == base + 765
    assert tokens.count_message(message(image(None)), model="gpt-4o") == base + 765
    both = message(text, image("low"), image("high"))
    assert (
        tokens.count_message(both, model="gpt-4o")
        == base + n(name, "What is in this picture?") + 85 + 765
    )
    # the estimate is the documented constant, not a guess hidden in the code
    assert (tokens.IMAGE_LOW_TOKENS, tokens.IMAGE_TOKENS) == (85, 85 + 4 * 170)


def test_refusal_parts_are_counted_like_text() -> None:
    name = "o200k_base"
    refusal = "I can't help with that request."
    message = {"role": "assistant", "content": [{"type": "refusal", "refusal": refusal}]}
    assert tokens.count_message(message, model="gpt-4o") == 3 + n(name, "assistant") + n(
        name, refusal
    )


def test_refusal_field_of_an_assistant_reply_is_counted() -> None:
    name = "o200k_base"
    refusal = "I can't help with that request."
    reply = {"role": "assistant", "content": None, "refusal": refusal}
    assert tokens.count_message(reply, model="gpt-4o") == 3 + n(name, "assistant") + n(
        name, refusal
    )


# --- stored counts ------------------------------------------------------------------------

MESSAGES = [
    user_message(SAMPLES[1], name="alice"),
    assistant_calls("call_1", arguments='{"q": "flights"}'),
    tool_result("call_1", SAMPLES[2]),
    assistant_message("Found 3 flights."),
    user_message(
        [
            {"type": "text", "text": "And this?"},
            {"type": "image_url", "image_url": {"url": "https://x.test/i.png", "detail": "low"}},
        ]
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])
def test_stored_token_counts_and_active_tokens(user, model: str) -> None:
    conversation = conversation_create(owner=user, model=model, system="Be brief.")
    message_append(conversation=conversation, messages=MESSAGES[:3])
    message_append(conversation=conversation, messages=[MESSAGES[3]])
    message_append(conversation=conversation, messages=[MESSAGES[4]])

    rows = list(Message.objects.filter(conversation=conversation).order_by("seq"))
    assert len(rows) == 6
    for row in rows:
        assert row.token_count == tokens.count_message(row.as_openai(), model=model)
    # The conversation's model picks the encoding: gpt-4 and gpt-4o differ on these samples.
    other = "gpt-4" if model == "gpt-4o" else "gpt-4o"
    assert rows[3].token_count != tokens.count_message(rows[3].as_openai(), model=other)

    conversation.refresh_from_db()
    total = Message.objects.filter(conversation=conversation).aggregate(t=Sum("token_count"))["t"]
    assert conversation.active_tokens == total == sum(row.token_count for row in rows)
    context = context_get(conversation=conversation)
    assert context.token_count == total + tokens.REPLY_PRIMING
