"""System checks for the CTXSUM settings: each contradiction has its own id, found at start-up."""

from __future__ import annotations

from typing import Any

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
from django.core.checks import run_checks
from django.test import override_settings

from ctxsum import tokens


def ctxsum_messages(**settings: Any) -> list:
    with override_settings(CTXSUM=settings):
        return [m for m in run_checks() if m.id and m.id.startswith("ctxsum.")]


def ctxsum_ids(**settings: Any) -> list[str]:
    return sorted(m.id for m in ctxsum_messages(**settings))


def test_default_settings_give_no_ctxsum_messages() -> None:
    assert ctxsum_ids() == []


def test_the_projects_settings_give_no_ctxsum_errors() -> None:
    messages = [m for m in run_checks() if m.id and m.id.startswith("ctxsum.")]
    assert [m for m in messages if m.is_serious()] == []


def test_a_valid_custom_configuration_passes() -> None:
    assert (
        ctxsum_ids(
            TRIGGER={"messages": 40, "tokens": 8000},
            KEEP={"tokens": 2000},
            SUMMARY_TIMEOUT=2.5,
            MAX_BATCH_MESSAGES=10,
            ENCODING="cl100k_base",
            PROMPT="Summarize.",
        )
        == []
    )


def test_unknown_key() -> None:
    messages = ctxsum_messages(TRIGGERS={"tokens": 100})
    assert [m.id for m in messages] == ["ctxsum.E001"]
    assert "TRIGGERS" in messages[0].msg
    assert "TRIGGER" in messages[0].hint


@pytest.mark.parametrize(
    "trigger",
    [{"turns": 5}, {}, "often", {"tokens": 0}, {"messages": -1}, {"tokens": "100"}, None],
)
def test_bad_trigger(trigger) -> None:
    assert ctxsum_ids(TRIGGER=trigger) == ["ctxsum.E002"]


@pytest.mark.parametrize(
    "keep",
    [{"messages": 2, "tokens": 100}, {}, {"turns": 3}, {"messages": 0}, [5], {"messages": True}],
)
def test_bad_keep(keep) -> None:
    assert ctxsum_ids(KEEP=keep) == ["ctxsum.E003"]


@pytest.mark.parametrize(
    ("trigger", "keep"),
    [
        ({"messages": 10}, {"messages": 10}),
        ({"messages": 10}, {"messages": 11}),
        ({"tokens": 1000}, {"tokens": 1000}),
        ({"messages": 50, "tokens": 1000}, {"tokens": 4000}),
    ],
)
def test_keep_not_below_trigger(trigger, keep) -> None:
    assert ctxsum_ids(TRIGGER=trigger, KEEP=keep) == ["ctxsum.E004"]


@pytest.mark.parametrize(
    ("trigger", "keep", "ids"), [(5, 2, ["ctxsum.E004"]), (6, 2, []), (5, 1, [])]
)
def test_kept_tail_that_always_reaches_the_trigger_is_an_error(trigger, keep, ids) -> None:
    # System message + summary + facts block + kept tail: 1 + 1 + 1 + 2 = 5 reaches 5.
    assert ctxsum_ids(TRIGGER={"messages": trigger}, KEEP={"messages": keep}) == ids


@pytest.mark.parametrize(
    ("settings_", "ids"),
    [
        ({"TARGET_RATIO": 0}, ["ctxsum.E009"]),
        ({"TARGET_RATIO": 1}, ["ctxsum.E009"]),
        ({"TARGET_RATIO": "0.5"}, ["ctxsum.E009"]),
        ({"TARGET_RATIO": 0.3}, []),
        ({"MAX_CONTEXT_TOKENS": 0}, ["ctxsum.E005"]),
        ({"MAX_CONTEXT_TOKENS": 8000}, []),
        ({"LEASE_SECONDS": -1}, ["ctxsum.E005"]),
        ({"LEASE_SECONDS": 30, "SUMMARY_TIMEOUT": 60}, ["ctxsum.W003"]),
        ({"LEASE_SECONDS": 90, "SUMMARY_TIMEOUT": 60}, []),
        ({"IDEMPOTENCY_KEY_SECONDS": 0}, ["ctxsum.E005"]),
        ({"IDEMPOTENCY_KEY_SECONDS": "1 day"}, ["ctxsum.E005"]),
        ({"IDEMPOTENCY_CLAIM_SECONDS": -1}, ["ctxsum.E005"]),
        ({"IDEMPOTENCY_CLAIM_SECONDS": 30, "SUMMARY_TIMEOUT": 60}, ["ctxsum.W004"]),
        ({"IDEMPOTENCY_KEY_SECONDS": 3600, "IDEMPOTENCY_CLAIM_SECONDS": 120}, []),
        # 600 - the prompt (~230) - 256 leaves less than 256 tokens of history per call.
        ({"SUMMARY_INPUT_BUDGET": 600, "SUMMARY_MAX_TOKENS": 256}, ["ctxsum.E010"]),
        ({"SUMMARY_INPUT_BUDGET": 900, "SUMMARY_MAX_TOKENS": 256}, []),
    ],
)
def test_ratio_ceiling_and_lease_settings(settings_, ids) -> None:
    assert ctxsum_ids(**settings_) == ids


def test_keep_in_another_unit_than_the_trigger_is_fine() -> None:
    assert ctxsum_ids(TRIGGER={"tokens": 1000}, KEEP={"messages": 500}) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("SUMMARY_TIMEOUT", 0),
        ("SUMMARY_TIMEOUT", -1.5),
        ("SUMMARY_MAX_TOKENS", "1024"),
        ("SUMMARY_INPUT_BUDGET", None),
        ("LEASE_SECONDS", True),
        ("MAX_MESSAGE_BYTES", 0),
        ("MAX_BATCH_MESSAGES", -5),
        ("MAX_BODY_BYTES", [1]),
    ],
)
def test_non_positive_numbers(key, value) -> None:
    messages = ctxsum_messages(**{key: value})
    assert [m.id for m in messages] == ["ctxsum.E005"]
    assert key in messages[0].msg


@pytest.mark.parametrize("key", ["PROMPT", "PROMPT_VERSION", "SUMMARY_PREFIX"])
@pytest.mark.parametrize("value", ["", "   \n", None, 3])
def test_blank_prompt(key, value) -> None:
    messages = ctxsum_messages(**{key: value})
    assert [m.id for m in messages] == ["ctxsum.E006"]
    assert key in messages[0].msg


@pytest.mark.parametrize(
    "path",
    [
        "ctxsum.summarizers.nonexistent.Summarizer",
        "ctxsum.summarizers.offline.NoSuchClass",
        "not_a_dotted_path",
        "ctxsum.models.Conversation",  # importable, but not a Summarizer
    ],
)
def test_bad_summarizer_path(path) -> None:
    messages = ctxsum_messages(SUMMARIZER=path)
    assert [m.id for m in messages] == ["ctxsum.E007"]


def test_the_offline_summarizer_passes() -> None:
    assert ctxsum_ids(SUMMARIZER="ctxsum.summarizers.offline.OfflineSummarizer") == []


def test_several_problems_are_reported_together() -> None:
    assert ctxsum_ids(TRIGGER={}, KEEP={}, SUMMARY_TIMEOUT=0, PROMPT="") == [
        "ctxsum.E002",
        "ctxsum.E003",
        "ctxsum.E005",
        "ctxsum.E006",
    ]


def test_every_problem_is_reported_in_one_run() -> None:
    """A typo does not hide the other mistakes: an unknown key, a bad trigger, a number, a
    summarizer path, a runner and a chat setting, all in one ``check``."""
    messages = ctxsum_messages(
        TRIGER={"messages": 9},
        TRIGGER={"messages": -1},
        SUMMARY_INPUT_BUDGET=0,
        SUMMARIZER="ctxsum.summarizers.nowhere.Nothing",
        COMPACTION_RUNNER="nowhere.enqueue",
        CHAT_RETRIES=-1,
    )
    assert sorted(m.id for m in messages) == [
        "ctxsum.E001",
        "ctxsum.E002",
        "ctxsum.E005",
        "ctxsum.E007",
        "ctxsum.E014",
        "ctxsum.E020",
    ]
    assert any("TRIGER" in m.msg for m in messages)


def test_a_check_that_reads_an_invalid_number_waits_for_it() -> None:
    """The input budget's check reads SUMMARY_MAX_TOKENS: with that invalid, E005 alone
    names it (no E010 computed from it); the checks that do not read it still run."""
    ids = ctxsum_ids(SUMMARY_MAX_TOKENS="lots", COMPACTION_RUNNER="nowhere.enqueue")
    assert ids == ["ctxsum.E005", "ctxsum.E020"]


@pytest.fixture
def no_tiktoken_files(monkeypatch, tmp_path):
    """An empty TIKTOKEN_CACHE_DIR and no route to the download, with every cache of a
    loaded encoding cleared; all restored afterwards."""

    def offline(blobpath: str) -> bytes:
        raise ConnectionError(f"no route to {blobpath}")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    saved = dict(tiktoken.registry.ENCODINGS)

    def clear() -> None:
        tokens.get_encoding.cache_clear()
        tokens.encoding_name_for_model.cache_clear()
        tiktoken.registry.ENCODINGS.clear()

    clear()
    try:
        yield tmp_path
    finally:
        clear()
        tiktoken.registry.ENCODINGS.update(saved)


def test_encoding_that_cannot_be_loaded_warns(no_tiktoken_files) -> None:
    messages = ctxsum_messages()
    assert [m.id for m in messages] == ["ctxsum.W001"]
    warning = messages[0]
    assert not warning.is_serious()
    assert "TIKTOKEN_CACHE_DIR" in warning.hint
    assert list(no_tiktoken_files.iterdir()) == []


def test_the_outage_really_blocks_loading(no_tiktoken_files) -> None:
    with pytest.raises(ConnectionError):
        tokens.encoding_for("gpt-4o")


def test_encoding_is_back_after_the_outage() -> None:
    # Runs after the tests above: nothing of the outage may stay cached.
    assert ctxsum_ids() == []
    assert tokens.count_text("hello world", model="gpt-4o") == 2


def test_unknown_encoding_setting_warns() -> None:
    messages = ctxsum_messages(ENCODING="no_such_base")
    assert [m.id for m in messages] == ["ctxsum.W001"]


@pytest.mark.parametrize(
    ("upload", "ids"),
    [(2_621_440, ["ctxsum.E013"]), (8 * 1024 * 1024, []), (None, [])],
)
def test_djangos_upload_limit_must_not_undercut_max_body_bytes(settings, upload, ids) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = upload  # 2.5 MiB is Django's default
    assert ctxsum_ids(MAX_BODY_BYTES=8 * 1024 * 1024) == ids
    assert ctxsum_ids(MAX_BODY_BYTES=1_000_000) == []
    assert ctxsum_ids() == []  # the defaults agree


@pytest.mark.parametrize(
    "chat_settings",
    [
        {"CHAT_TIMEOUT": 0},
        {"CHAT_TURN_SECONDS": "long"},
        {"CHAT_RETRIES": -1},
        {"CHAT_RETRIES": 1.5},
        {"CHAT_RETRY_BACKOFF": -0.1},
        {"CHAT_MAX_CALLS_PER_CONVERSATION": 0},
        {"CHAT_MAX_CALLS_PER_USER_PER_DAY": True},
        {"CHAT_FALLBACK_MODELS": "gpt-4o-mini"},
        {"CHAT_FALLBACK_MODELS": ["ok", ""]},
        {"CHAT_OPTIONS": {"base_uri": "http://x"}},
        {"CHAT_OPTIONS": {"api_key": 5}},
        {"CHAT_OPTIONS": {"max_tokens_param": "max_output_tokens"}},
        {"CHAT_OPTIONS": "http://x"},
    ],
)
def test_bad_chat_settings(chat_settings) -> None:
    assert ctxsum_ids(**chat_settings) == ["ctxsum.E014"]


def test_good_chat_settings_and_a_short_turn_lock() -> None:
    good = {
        "CHAT_FALLBACK_MODELS": ["gpt-4o-mini"],
        "CHAT_OPTIONS": {"base_url": "http://127.0.0.1:8080/v1", "max_tokens_param": "max_tokens"},
        "CHAT_RETRIES": 0,
        "CHAT_RETRY_BACKOFF": 0,
        "CHAT_MAX_CALLS_PER_CONVERSATION": 100,
        "CHAT_MAX_CALLS_PER_USER_PER_DAY": 1000,
    }
    assert ctxsum_ids(**good) == []
    assert ctxsum_ids(CHAT_TIMEOUT=120, CHAT_TURN_SECONDS=60) == ["ctxsum.W005"]


@pytest.mark.parametrize("value", [-1, 1.5, "500", True, None])
def test_facts_max_tokens_must_be_a_whole_number_of_zero_or_more(value: Any) -> None:
    assert ctxsum_ids(FACTS_MAX_TOKENS=value) == ["ctxsum.E005"]


def test_no_facts_block_is_a_valid_setting() -> None:
    assert ctxsum_ids(FACTS_MAX_TOKENS=0) == []


def test_the_openai_facts_format_is_checked() -> None:
    options = {"api_key": "k", "facts_format": "yaml"}
    assert ctxsum_ids(
        SUMMARIZER="ctxsum.summarizers.openai.OpenAISummarizer", SUMMARIZER_OPTIONS=options
    ) == ["ctxsum.E012"]
