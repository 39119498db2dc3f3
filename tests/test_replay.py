"""Replay a deterministic subset of the real conversations (../shared/data) through the
benchmark's own replay code (tests/support/replay.py, which ``python -m bench.replay`` runs):
one message appended at a time, a compaction attempted after every append, the shared
invariants (tests/invariants.py) checked after every step, no context larger than the full
history, and each compaction's summary metadata (and what the summarizer was sent) checked by
the replay and again here.

The full replay with ``--check`` is ``python -m bench.replay --check`` (what CI runs).
"""

from __future__ import annotations

import collections
import functools
import gzip
import hashlib
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from ctxsum.summarizers.offline import OfflineSummarizer
from tests.invariants import assert_context_invariants
from tests.support.replay import TRIGGER, ReplayViolation, query_scaling, replay_conversation
from tests.support.replay_data import iter_records
from tests.support.replay_django import OFFLINE_SUMMARIZER
from tests.support.replay_report import build_report
from tests.support.replay_stats import ReplayStats, percentile
from tests.support.shared import DATA_DIR, DATA_FILES, REPO_ROOT, data_present
from tests.support.summarizer_calls import summarizer_calls

AGENTS, CHATS = DATA_FILES

pytestmark = pytest.mark.skipif(
    not data_present(), reason=f"the real conversations are not there: {DATA_DIR}"
)


# --------------------------------------------------------------------------- the subset


@functools.cache
def records(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(record for _, record in iter_records(DATA_DIR, [name]))


def tool_calls(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [call for message in messages for call in message.get("tool_calls") or ()]


def most_parallel(messages: Sequence[Mapping[str, Any]]) -> int:
    return max((len(message.get("tool_calls") or ()) for message in messages), default=0)


def unanswered_calls(messages: Sequence[Mapping[str, Any]]) -> set[tuple[int, str]]:
    """(message index, call id) of the requests no tool result answers; a result belongs to
    the nearest earlier request with its id."""
    requested_at: dict[str, tuple[int, str]] = {}
    requests, answered = set(), set()
    for index, message in enumerate(messages):
        for call in message.get("tool_calls") or ():
            requested_at[call["id"]] = (index, call["id"])
            requests.add((index, call["id"]))
        if message["role"] == "tool":
            answered.add(requested_at[message["tool_call_id"]])
    return requests - answered


def reuses_ids(messages: Sequence[Mapping[str, Any]]) -> bool:
    counts = collections.Counter(call["id"] for call in tool_calls(messages))
    return any(count > 1 for count in counts.values())


def looping_run() -> dict[str, Any]:
    return max(records(AGENTS), key=lambda record: len(record["messages"]))


def parallel_runs() -> list[dict[str, Any]]:
    """The run with the most tool calls in one message (20), and the 9 shortest runs with
    7 or more in one message."""
    runs = [record for record in records(AGENTS) if most_parallel(record["messages"]) >= 7]
    widest = max(runs, key=lambda record: most_parallel(record["messages"]))
    rest = [record for record in runs if record is not widest]
    return [widest, *sorted(rest, key=lambda record: (len(record["messages"]), record["id"]))[:9]]


def unanswered_runs() -> list[dict[str, Any]]:
    return [record for record in records(AGENTS) if unanswered_calls(record["messages"])]


def reused_id_runs() -> list[dict[str, Any]]:
    """The 10 shortest runs that reuse a tool-call id (the long ones: see the looping run)."""
    runs = [record for record in records(AGENTS) if reuses_ids(record["messages"])]
    return sorted(runs, key=lambda record: (len(record["messages"]), record["id"]))[:10]


def long_chats() -> list[dict[str, Any]]:
    """10 dialogues spread evenly over the file (the file is sorted longest first)."""
    chats = records(CHATS)
    return [chats[index * len(chats) // 10] for index in range(10)]


# --------------------------------------------------------------------------- helpers


def replay_all(subset: Sequence[Mapping[str, Any]], owner: Any) -> Any:
    """Replay ``subset`` with the invariants after every step and no context allowed to
    cost more than the full history; check each conversation's summaries; return the
    stats."""
    stats = ReplayStats()
    for record in subset:
        before = stats.compactions
        conversation = replay_conversation(
            record, owner=owner, stats=stats, checker=assert_context_invariants, check_size=True
        )
        assert_summaries(conversation, compactions=stats.compactions - before)
    assert stats.conversations == len(subset)
    assert stats.messages == sum(len(record["messages"]) for record in subset)
    assert stats.context_over_history == 0
    assert sum(stats.reasons.values()) == stats.messages
    assert stats.reasons["compacted"] == stats.compactions
    assert stats.reasons["no_gain"] == stats.no_gain_summarized + stats.no_gain_not_sent
    # Archiving is one bulk UPDATE, and the number of queries does not depend on how many
    # messages a compaction archives: only on its kind (a first summary has no previous one
    # to deactivate; an archived range with tool calls costs one EXISTS more).
    assert set(stats.compaction_message_updates) <= {1}
    for values in stats.queries_by_kind.values():
        assert len(values) == 1, stats.queries_by_kind
    return stats


def assert_summaries(conversation: Any, *, compactions: int) -> None:
    """Summaries 1..k, one per compaction, each naming the prompt setting in use (version
    and SHA-256 of PROMPT, not of the prompt sent with its length line), the model that
    wrote it (the replays' offline backend ran none, and says so), a cumulative range and
    its predecessor."""
    from ctxsum.conf import ctxsum_settings
    from ctxsum.models import Summary
    from ctxsum.summarizers.offline import OFFLINE_MODEL

    model = OFFLINE_MODEL

    summaries = list(Summary.objects.filter(conversation=conversation).order_by("version"))
    assert [summary.version for summary in summaries] == list(range(1, compactions + 1))
    prompt_hash = hashlib.sha256(ctxsum_settings.PROMPT.encode()).hexdigest()
    for index, summary in enumerate(summaries):
        previous = summaries[index - 1] if index else None
        assert summary.prompt_version == ctxsum_settings.PROMPT_VERSION
        assert summary.prompt_sha256 == prompt_hash
        assert summary.model and summary.model == model
        assert summary.previous_id == (previous.pk if previous else None)
        assert summary.from_seq <= summary.to_seq
        if previous is not None:
            assert summary.from_seq == previous.from_seq
            assert summary.to_seq > previous.to_seq
            assert not previous.active
        assert summary.active == (summary is summaries[-1])


@pytest.fixture
def offline(settings):
    """The replay's summarizer whatever the environment says, and no automatic compaction
    (the replay compacts after every append itself)."""
    settings.CTXSUM = {
        **settings.CTXSUM,
        "SUMMARIZER": OFFLINE_SUMMARIZER,
        "AUTO_COMPACT": False,
    }


class VerboseSummarizer(OfflineSummarizer):
    """Answers with the whole history twice: never smaller than what it would replace."""

    def summarize(self, *, prompt: str, history: str, model: str, budget: int) -> str:
        self.require_history(history)
        return f"{history}\n{history}".strip()


@pytest.fixture
def verbose(settings):
    settings.CTXSUM = {
        **settings.CTXSUM,
        "SUMMARIZER": f"{__name__}.VerboseSummarizer",
        "AUTO_COMPACT": False,
    }


# --------------------------------------------------------------------------- replays


@pytest.mark.django_db
@pytest.mark.slow
def test_looping_run(user, offline):
    record = looping_run()
    names = collections.Counter(call["function"]["name"] for call in tool_calls(record["messages"]))
    assert len(record["messages"]) == 209 and max(names.values()) >= 80
    stats = replay_all([record], user)
    assert stats.compactions >= 40
    # At the end the context is a small fraction of the 209 messages.
    assert stats.final_reductions[0] > 0.5
    assert stats.max_active_messages < 30  # bounded by the policy, not the run's length


@pytest.mark.django_db
@pytest.mark.slow
def test_parallel_tool_calls(user, offline):
    subset = parallel_runs()
    assert len(subset) == 10 and most_parallel(subset[0]["messages"]) == 20
    stats = replay_all(subset, user)
    assert stats.compactions > 0


@pytest.mark.django_db
def test_call_that_never_gets_a_result(user, offline):
    subset = unanswered_runs()
    assert len(subset) == 1
    stats = replay_all(subset, user)
    assert stats.compactions > 0


@pytest.mark.django_db
@pytest.mark.slow
def test_reused_tool_call_ids(user, offline):
    subset = reused_id_runs()
    assert len(subset) == 10
    stats = replay_all(subset, user)
    assert stats.compactions > 0


@pytest.mark.django_db
@pytest.mark.slow
def test_long_chats(user, offline):
    subset = long_chats()
    stats = replay_all(subset, user)
    assert stats.compactions >= 10
    # Short human turns: the summary is large next to them, but the context still shrinks.
    assert percentile(stats.reductions, 50) > 0.1


@pytest.mark.django_db
def test_one_shot_compactions_take_the_same_queries_whatever_their_size(user, offline):
    rows = query_scaling(looping_run(), owner=user, checker=assert_context_invariants)
    assert [row["archived"] for row in rows] == sorted({row["archived"] for row in rows})
    assert rows[-1]["archived"] >= 128
    assert {row["message_updates"] for row in rows} == {1}
    by_kind = collections.defaultdict(set)
    for row in rows:
        by_kind[row["kind"]].add(row["queries"])
        assert row["summary_tokens"] < row["summarizer_input_tokens"]
    assert all(len(queries) == 1 for queries in by_kind.values()), by_kind
    # The range holding tool calls costs one EXISTS more, whatever its length; the key
    # facts merged cost the same few statements however many there are (facts_kind).
    assert any(kind.startswith("first, tool calls archived") for kind in by_kind), by_kind


@pytest.mark.django_db
def test_the_stored_model_is_the_one_sent(user, offline, settings):
    """With SUMMARY_MODEL blank the summary is written with the conversation's chat model
    (here the settings' default), and stored under the model the backend reports, which the
    replay's checks agree with."""
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARY_MODEL": "", "DEFAULT_MODEL": "gpt-4.1"}
    record = long_chats()[1]
    with summarizer_calls() as calls:
        stats = replay_all([record], user)
    assert stats.compactions > 0
    assert {call.model for call in calls} == {"gpt-4.1"}
    from ctxsum.models import Summary

    # The offline backend ran no model, and says so.
    assert set(Summary.objects.values_list("model", flat=True)) == {"offline"}


@pytest.mark.django_db
@pytest.mark.slow
def test_summaries_that_are_no_smaller_are_skipped_as_no_gain(user, verbose, settings):
    """Every summary is larger than what it would replace: nothing is compacted, each
    range goes to the summarizer once (a range that has not grown is not sent again), and
    the context never costs more than the full history."""
    # Room for the whole run in one call, so one call is one range sent.
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARY_INPUT_BUDGET": 48000}
    subset = [looping_run(), long_chats()[0]]
    stats = replay_all(subset, user)
    assert stats.compactions == 0
    assert stats.reasons["no_gain"] > 0
    assert stats.no_gain_summarized > 0 and stats.no_gain_not_sent > 0
    assert stats.summarizer_calls == stats.no_gain_summarized
    report = build_report(stats)
    assert report["no_gain_skips"] == stats.reasons["no_gain"]
    assert report["steps_with_context_over_full_history"] == 0
    # Nothing was compacted, so the context still reaches the trigger.
    assert report["compact_calls_over_trigger"]["no_gain"] == stats.reasons["no_gain"]


# --------------------------------------------------------------------------- the replay fails


@pytest.mark.django_db
def test_a_context_larger_than_the_history_is_counted_and_stops_a_checked_replay(
    user, verbose, monkeypatch
):
    """Were a larger summary committed, the replay would count the steps whose context
    costs more than the full history, and a checked replay stops at the first."""
    from ctxsum.services import compaction

    monkeypatch.setattr(compaction, "gain_check", lambda *args, **kwargs: None)
    # The summary check would name the missing gain first: let the size check see it.
    monkeypatch.setattr("tests.support.replay.summary_problems", lambda *args, **kwargs: [])
    record = long_chats()[0]
    stats = ReplayStats()
    replay_conversation(record, owner=user, stats=stats)
    assert stats.compactions > 0 and stats.context_over_history > 0
    with pytest.raises(ReplayViolation) as caught:
        replay_conversation(record, owner=user, check_size=True)
    assert caught.value.step == TRIGGER["messages"]  # the first compaction
    assert "more than the" in caught.value.problem


@pytest.mark.django_db
def test_a_summary_without_gain_stops_the_replay(user, verbose, monkeypatch):
    from ctxsum.services import compaction

    monkeypatch.setattr(compaction, "gain_check", lambda *args, **kwargs: None)
    record = long_chats()[0]
    with pytest.raises(ReplayViolation) as caught:
        replay_conversation(record, owner=user)
    assert caught.value.step == TRIGGER["messages"]
    assert "(no gain)" in caught.value.problem


@pytest.mark.django_db
def test_a_wrong_model_stops_the_replay(user, offline, monkeypatch):
    from ctxsum.services import summaries

    monkeypatch.setattr(summaries, "summary_model", lambda conversation: "some-other-model")
    record = long_chats()[0]
    with pytest.raises(ReplayViolation) as caught:
        replay_conversation(record, owner=user)
    assert caught.value.step == TRIGGER["messages"]
    assert "'some-other-model'" in caught.value.problem


@pytest.mark.django_db
def test_a_wrong_prompt_hash_stops_the_replay(user, offline, monkeypatch):
    from ctxsum import selectors

    monkeypatch.setattr(selectors, "prompt_sha256", lambda prompt: "0" * 64)
    record = long_chats()[0]
    with pytest.raises(ReplayViolation) as caught:
        replay_conversation(record, owner=user)
    assert caught.value.conversation_id == record["id"]
    assert caught.value.step == TRIGGER["messages"]  # the first compaction
    assert "prompt_sha256" in caught.value.problem


@pytest.mark.django_db
def test_an_invariant_violation_names_conversation_and_step(user, offline):
    record = long_chats()[0]

    def checker(conversation: Any, *, original_messages: Sequence[Any]) -> None:
        assert len(original_messages) < 5, "broken on purpose"

    with pytest.raises(ReplayViolation) as caught:
        replay_conversation(record, owner=user, checker=checker)
    assert (caught.value.conversation_id, caught.value.step) == (record["id"], 5)
    assert "broken on purpose" in str(caught.value)


def test_check_every_checks_every_nth_step_each_compaction_and_the_last(user, offline):
    record = long_chats()[0]
    steps: list[int] = []
    compacted: list[int] = []

    def checker(conversation: Any, *, original_messages: Sequence[Any]) -> None:
        steps.append(len(original_messages))
        if conversation.compaction_count > len(compacted):
            compacted.append(len(original_messages))

    stats = ReplayStats()
    replay_conversation(record, owner=user, stats=stats, checker=checker, check_every=7)
    last = len(record["messages"])
    assert stats.compactions > 1 and len(compacted) == stats.compactions
    assert steps == sorted({*range(7, last + 1, 7), *compacted, last})
    assert stats.checked_steps == len(steps) < last
    # A state broken at an unchecked step is caught at the next one checked.
    with pytest.raises(ReplayViolation) as caught:
        replay_conversation(
            record,
            owner=user,
            checker=lambda conversation, *, original_messages: _fails_from(5, original_messages),
            check_every=7,
        )
    assert caught.value.step == min(step for step in steps if step >= 5)


def _fails_from(step: int, original_messages: Sequence[Any]) -> None:
    assert len(original_messages) < step, "broken since step 5"


# --------------------------------------------------------------------------- the script


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.replay", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )


@pytest.mark.slow
def test_script_exits_0_and_writes_results(tmp_path):
    output = tmp_path / "replay.json"
    done = run_script(
        "--check",
        "--jobs",
        "1",
        "--files",
        CHATS,
        "--limit",
        "2",
        "--no-probe",
        "--output",
        str(output),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(output.read_text())
    assert report["conversations"] == 2 and report["check"] is True
    assert report["invariant_checker"] == "tests/invariants.py"
    # The erasure probe after each conversation (--check) may compact once more.
    assert report["erasure_probes"] == 2
    probes = report["erasure_probe_compactions"]
    assert report["compactions"] + probes == report["summaries"] > 0
    assert report["compaction_calls"]["compacted"] == report["compactions"]
    assert sum(report["compaction_calls"].values()) == report["messages"]
    assert report["no_gain_skips"] == report["compaction_calls"].get("no_gain", 0)
    assert report["steps_with_context_over_full_history"] == 0
    assert report["compactions_over_trigger"] == 0
    assert report["message_updates_per_compaction"] == {"1": report["compactions"]}
    assert "token reduction at turn >= 20" in done.stdout


@pytest.mark.slow
def test_script_exits_1_on_a_violation(tmp_path):
    with gzip.open(DATA_DIR / CHATS, "rt") as lines:
        record = json.loads(lines.readline())
    bad = {"role": "tool", "tool_call_id": "call_nobody_made", "content": "42"}
    record["messages"] = [*record["messages"][:3], bad, *record["messages"][3:]]
    (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n")
    done = run_script(
        "--check",
        "--jobs",
        "1",
        "--data-dir",
        str(tmp_path),
        "--files",
        "bad.jsonl",
        "--output",
        str(tmp_path / "out.json"),
    )
    assert done.returncode == 1
    assert f"conversation {record['id']} step 4" in done.stdout
    assert not (tmp_path / "out.json").exists()
