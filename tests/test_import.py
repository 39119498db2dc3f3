"""ctxsum_import: JSON Lines in, conversations out through the service layer; rejected lines
change nothing, re-runs skip what is there, and real conversations round-trip exactly: the
ones shipped in tests/fixtures/ always, the whole data set where it is on the machine."""

from __future__ import annotations

import gzip
import json
import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ctxsum.models import Conversation, Message
from ctxsum.selectors import transcript_list
from tests.factories import (
    assistant_calls,
    assistant_message,
    real_conversations,
    system_message,
    tool_result,
    user_message,
    write_jsonl,
)
from tests.support.shared import DATA_DIR, DATA_FILES, FIXTURE_CONVERSATIONS


def record(number: int, **extra) -> dict:
    """A small conversation in the data format, with a tool call and its result."""
    call_id = f"call_{number}"
    return {
        "id": f"synthetic-{number}",
        "source": "tests/test_import.py",
        "license": "MIT",
        "valid": True,
        "meta": {"domain": "test", "n_messages": 5, "issues": ["x" * 300]},
        "messages": [
            system_message("You help with orders."),
            user_message(f"Where is order #{number}?"),
            assistant_calls(call_id, name="find_order", arguments=f'{{"id": {number}}}'),
            tool_result(call_id, '{"status": "shipped"}'),
            assistant_message(f"Order #{number} has shipped."),
        ],
        **extra,
    }


def run_import(*args, **options) -> str:
    out = StringIO()
    call_command("ctxsum_import", *map(str, args), stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


def orphan_result_record(number: int) -> dict:
    bad = record(number)
    bad["messages"][3]["tool_call_id"] = "call_nowhere"
    return bad


@pytest.mark.django_db
def test_import_counts_rejects_and_skips_on_rerun(tmp_path, user):
    path = write_jsonl(
        tmp_path / "convs.jsonl.gz",
        [record(1), orphan_result_record(2), "", "{not json", record(3)],
    )

    output = run_import(path, user=user.username)

    assert "2 conversations, 10 messages imported; 2 rejected; 0 skipped" in output
    assert re.search(r"convs\.jsonl\.gz:2: messages\[3\]\.tool_call_id: .*call_nowhere", output)
    assert "convs.jsonl.gz:4: not valid JSON" in output
    conversations = Conversation.objects.filter(owner=user)
    assert conversations.count() == 2
    assert Message.objects.filter(conversation__owner=user).count() == 10
    first = conversations.get(metadata__source_id="synthetic-1")
    assert first.title == "Where is order #1?"
    assert first.metadata == {
        "domain": "test",
        "n_messages": 5,
        "source_id": "synthetic-1",
        "source": "tests/test_import.py",
        "license": "MIT",
    }
    assert [row.as_openai() for row in transcript_list(conversation=first)] == (
        record(1)["messages"]
    )

    again = run_import(path, user=user.username, verbosity=0)

    assert "0 conversations, 0 messages imported; 2 rejected; 2 skipped" in again
    assert conversations.count() == 2


@pytest.mark.django_db
def test_import_plain_file_limit_title_and_several_files(tmp_path, user):
    plain = write_jsonl(
        tmp_path / "a.jsonl", [record(1, title="Named"), record(2), record(3), record(4)]
    )
    gzipped = write_jsonl(tmp_path / "b.jsonl.gz", [record(5), record(6)])

    output = run_import(plain, gzipped, user=user.username, limit=1)

    assert "a.jsonl: 1 conversations, 5 messages imported" in output
    assert "b.jsonl.gz: 1 conversations, 5 messages imported" in output
    assert "Imported for alice: 2 conversations, 10 messages imported; 0 rejected" in output
    assert set(Conversation.objects.values_list("title", flat=True)) == {
        "Named",
        "Where is order #5?",
    }

    output = run_import(plain, gzipped, user=user.username)

    assert "4 conversations, 20 messages imported; 0 rejected; 2 skipped" in output
    assert Conversation.objects.filter(owner=user).count() == 6


@pytest.mark.django_db
def test_import_other_users_imports_do_not_count_as_done(tmp_path, user, other_user):
    path = write_jsonl(tmp_path / "a.jsonl", [record(1)])
    run_import(path, user=other_user.username)

    output = run_import(path, user=user.username)

    assert "1 conversations, 5 messages imported; 0 rejected; 0 skipped" in output
    assert Conversation.objects.filter(owner=user).count() == 1


@pytest.mark.django_db
def test_import_rejects_records_that_are_not_conversations(tmp_path, user):
    too_many = record(3)
    too_many["messages"] = [user_message("hi")] * 1001
    path = write_jsonl(
        tmp_path / "a.jsonl",
        ['["a list"]', {"messages": []}, {"id": "x", "messages": []}, too_many],
    )

    output = run_import(path, user=user.username)

    assert "0 conversations, 0 messages imported; 4 rejected" in output
    assert "a.jsonl:1: not a JSON object" in output
    assert "a.jsonl:2: no 'id'" in output
    assert "a.jsonl:3: no 'messages'" in output
    assert "a.jsonl:4: A batch holds 1001 messages" in output
    assert not Conversation.objects.exists()


@pytest.mark.django_db
def test_import_errors_for_missing_file_and_unknown_user(tmp_path, user, django_user_model):
    path = write_jsonl(tmp_path / "a.jsonl", [record(1)])

    with pytest.raises(CommandError, match="No such file"):
        run_import(tmp_path / "missing.jsonl", user=user.username)
    with pytest.raises(CommandError, match="No user 'nobody'"):
        run_import(path, user="nobody")
    assert not Conversation.objects.exists()

    output = run_import(path, user="nobody", create_user=True)

    created = django_user_model.objects.get(username="nobody")
    assert not created.has_usable_password()
    assert "1 conversations, 5 messages imported" in output
    assert Conversation.objects.get().owner == created


def tool_call_ids(messages: list[dict]) -> list[str]:
    return [call["id"] for message in messages for call in message.get("tool_calls") or ()]


def test_the_shipped_real_conversations_hold_the_awkward_cases():
    """tests/fixtures/conversations.jsonl keeps what it is there for, and its README names
    the source and license of each conversation."""
    records = real_conversations()
    readme = (FIXTURE_CONVERSATIONS.parent / "README.md").read_text(encoding="utf-8")
    assert len({record["id"] for record in records}) == len(records) == 12
    for record in records:
        assert record["valid"] and record["license"].startswith("MIT"), record["id"]
        assert f"`{record['id']}`" in readme and record["source"] in readme, record["id"]
    runs = [record["messages"] for record in records if tool_call_ids(record["messages"])]
    parallel = [
        max(len(message.get("tool_calls") or ()) for message in messages) for messages in runs
    ]
    assert max(parallel) >= 8 and sum(width >= 2 for width in parallel) >= 3
    assert any(len(set(ids)) < len(ids) for ids in map(tool_call_ids, runs))  # a reused id
    unanswered = [
        set(tool_call_ids(messages))
        - {message.get("tool_call_id") for message in messages if message["role"] == "tool"}
        for messages in runs
    ]
    assert [ids for ids in unanswered if ids] == [{"call_submit"}]
    assert len(records) - len(runs) >= 3  # plain chats


@pytest.mark.django_db
def test_import_the_shipped_real_conversations_round_trips(user):
    """Each shipped conversation loads with no rejection, its transcript is its input
    message list exactly, and its metadata says where it came from."""
    records = {record["id"]: record for record in real_conversations()}
    message_total = sum(len(record["messages"]) for record in records.values())

    output = run_import(FIXTURE_CONVERSATIONS, user=user.username)

    assert (
        f"Imported for alice: {len(records)} conversations, {message_total} messages "
        "imported; 0 rejected; 0 skipped" in output
    ), output
    conversations = list(Conversation.objects.filter(owner=user))
    assert len(conversations) == len(records)
    for conversation in conversations:
        record = records[conversation.metadata["source_id"]]
        transcript = [row.as_openai() for row in transcript_list(conversation=conversation)]
        assert transcript == record["messages"], record["id"]
        assert conversation.message_count == len(transcript)
        assert conversation.metadata["source"] == record["source"]
        assert conversation.metadata["license"] == record["license"]

    again = run_import(FIXTURE_CONVERSATIONS, user=user.username)

    assert f"0 conversations, 0 messages imported; 0 rejected; {len(records)} skipped" in again


@pytest.mark.django_db
@pytest.mark.slow
def test_import_every_real_conversation_round_trips(user):
    """Every conversation of ../shared/data loads with no rejection, and its transcript is
    its input message list, exactly."""
    missing = [name for name in DATA_FILES if not (DATA_DIR / name).is_file()]
    if missing:
        pytest.skip(f"the real data set is not on this machine ({DATA_DIR}: {missing})")
    expected: dict[str, list[dict]] = {}
    per_file: dict[str, int] = {}
    for name in DATA_FILES:
        with gzip.open(DATA_DIR / name, "rt", encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle if line.strip()]
        per_file[name] = len(records)
        expected.update((item["id"], item["messages"]) for item in records)
    assert per_file == {"agent_trajectories.jsonl.gz": 396, "long_chats.jsonl.gz": 3720}
    message_total = sum(map(len, expected.values()))

    output = run_import(*(DATA_DIR / name for name in DATA_FILES), user=user.username)

    assert (
        f"Imported for alice: {len(expected)} conversations, {message_total} messages "
        "imported; 0 rejected; 0 skipped" in output
    ), output
    conversations = list(Conversation.objects.filter(owner=user))
    assert len(conversations) == len(expected) == 396 + 3720
    for conversation in conversations:
        transcript = [row.as_openai() for row in transcript_list(conversation=conversation)]
        source_id = conversation.metadata["source_id"]
        assert transcript == expected[source_id], source_id
        assert conversation.message_count == len(transcript)
