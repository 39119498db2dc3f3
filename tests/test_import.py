"""ctxsum_import: JSON Lines in, conversations out through the service layer; rejected lines
change nothing, re-runs skip what is there, and the real data set round-trips exactly."""

from __future__ import annotations

import gzip
import json
import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from ctxsum.models import Conversation, Message
from ctxsum.selectors import transcript_list

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
DATA_FILES = ("agent_trajectories.jsonl.gz", "long_chats.jsonl.gz")


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
            {"role": "system", "content": "You help with orders."},
            {"role": "user", "content": f"Where is order #{number}?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "find_order", "arguments": f'{{"id": {number}}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": '{"status": "shipped"}'},
            {"role": "assistant", "content": f"Order #{number} has shipped."},
        ],
        **extra,
    }


def write_jsonl(path: Path, lines: list) -> Path:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


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
    too_many["messages"] = [{"role": "user", "content": "hi"}] * 1001
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


@pytest.mark.django_db
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
