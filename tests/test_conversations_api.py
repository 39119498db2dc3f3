"""The conversation endpoints as clients use them: create, list, detail, PATCH (incl. the
system prompt), DELETE, appending, the transcript and the context."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.test import override_settings

from ctxsum import tokens
from ctxsum.conf import ctxsum_settings
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary, ToolCall
from ctxsum.services import conversation_create, message_append
from tests.factories import (
    assistant_calls,
    assistant_message,
    compact,
    compacted_conversation,
    long_user_message,
    system_message,
    tool_result,
    user_message,
)
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

LIST_URL = api_url("conversation-list")
STATS_KEYS = {
    "message_count",
    "active_message_count",
    "archived_message_count",
    "active_tokens",
    "summary_count",
    "compaction_count",
    "tokens_saved",
    "chat_turns",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
}
STORED_KEYS = {"seq", "token_count", "archived", "summary_version", "created_at"}
CALL = assistant_calls("call_1", name="f", arguments='{"a":1}')
RESULT = tool_result("call_1", "done")


def openai_tokens(messages: list[dict], model: str = "gpt-4o") -> int:
    return tokens.context_tokens(tokens.count_message(m, model=model) for m in messages)


# --- create, list, detail -----------------------------------------------------------------


def test_create_with_everything(api, user) -> None:
    messages = [user_message("Plan a trip to Porto."), CALL, RESULT, assistant_message("Done.")]
    body = {
        "title": "Porto",
        "system": "You plan trips.",
        "metadata": {"customer": 42, "tags": ["travel"]},
        "model": "gpt-4",
        "policy": {"trigger": {"messages": 40, "tokens": 9000}, "keep": {"tokens": 2000}},
        "messages": messages,
    }
    response = api.post(LIST_URL, body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["title"] == "Porto"
    assert data["system"] == "You plan trips."
    assert data["metadata"] == {"customer": 42, "tags": ["travel"]}
    assert data["model"] == "gpt-4"
    assert data["policy"] == {
        "trigger": {"messages": 40, "tokens": 9000},
        "keep": {"tokens": 2000},
        "max_context_tokens": None,
    }
    assert data["summary"] is None
    expected_context = [system_message("You plan trips."), *messages]
    expected_tokens = openai_tokens(expected_context, model="gpt-4")
    assert data["stats"] == {
        "message_count": 5,
        "active_message_count": 5,
        "archived_message_count": 0,
        "active_tokens": expected_tokens,
        "summary_count": 0,
        "compaction_count": 0,
        "tokens_saved": 0,
        "chat_turns": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_tokens": 0,
    }

    conversation = Conversation.objects.get(pk=data["id"])
    assert conversation.owner == user
    assert conversation.trigger == {"messages": 40, "tokens": 9000}
    assert conversation.keep == {"tokens": 2000}
    rows = list(Message.objects.filter(conversation=conversation).order_by("seq"))
    assert [row.seq for row in rows] == [0, 1, 2, 3, 4]
    assert rows[0].is_leading and not any(row.is_leading for row in rows[1:])
    assert [row.as_openai() for row in rows] == expected_context
    assert ToolCall.objects.filter(conversation=conversation, call_id="call_1").count() == 1
    context = api.get(api_url("context", data["id"])).json()
    assert context["messages"] == expected_context
    assert context["token_count"] == expected_tokens


def test_create_empty(api) -> None:
    response = api.post(LIST_URL, {}, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["system"] is None and data["title"] == "" and data["metadata"] == {}
    assert data["policy"] == {"trigger": None, "keep": None, "max_context_tokens": None}
    assert data["effective_policy"] == {
        "trigger": ctxsum_settings.TRIGGER,
        "keep": ctxsum_settings.KEEP,
        "max_context_tokens": ctxsum_settings.MAX_CONTEXT_TOKENS,
    }
    assert data["stats"]["message_count"] == 0
    context = api.get(api_url("context", data["id"])).json()
    assert context["messages"] == [] and context["token_count"] == tokens.REPLY_PRIMING


def test_list_newest_first_and_paginated(api, user) -> None:
    created = [conversation_create(owner=user, title=f"c{i}") for i in range(5)]
    newest_first = [str(c.pk) for c in reversed(created)]

    page1 = api.get(LIST_URL, {"page_size": 2}).json()
    page2 = api.get(LIST_URL, {"page_size": 2, "page": 2}).json()
    page3 = api.get(LIST_URL, {"page_size": 2, "page": 3}).json()
    assert page1["count"] == 5
    assert page1["next"] and page1["previous"] is None and page3["next"] is None
    ids = [row["id"] for page in (page1, page2, page3) for row in page["results"]]
    assert ids == newest_first
    assert [row["title"] for row in page1["results"]] == ["c4", "c3"]


def test_list_order_is_stable_when_created_at_ties(api, user) -> None:
    created = [conversation_create(owner=user, title=f"c{i}") for i in range(6)]
    Conversation.objects.filter(pk__in=[c.pk for c in created]).update(
        created_at=created[0].created_at
    )
    pages = [
        api.get(LIST_URL, {"page_size": 2, "page": page}).json()["results"] for page in (1, 2, 3)
    ]
    ids = [row["id"] for page in pages for row in page]
    assert sorted(ids) == sorted(str(c.pk) for c in created)  # none lost, none repeated


def test_detail_with_stats(api, user) -> None:
    conversation = conversation_create(
        owner=user, system="Sys.", messages=[user_message("a"), assistant_message("b")]
    )
    data = api.get(api_url("conversation-detail", conversation)).json()
    assert data["id"] == str(conversation.pk)
    assert set(data["stats"]) == STATS_KEYS
    assert data["stats"]["message_count"] == 3
    assert (
        data["stats"]["active_tokens"]
        == api.get(api_url("context", conversation)).json()["token_count"]
    )
    assert data["revision"] == conversation.revision


def test_stats_count_archived_messages_and_summaries(api, user) -> None:
    # Compacted for real: the system prompt, m0 and m1 archived under summary 1, two kept.
    conversation = compacted_conversation(
        user,
        system="Sys.",
        messages=[long_user_message(f"m{i}") for i in range(4)],
        keep={"messages": 2},
    )
    rows = list(Message.objects.filter(conversation=conversation).order_by("seq"))
    summary = Summary.objects.get(conversation=conversation)
    stats = api.get(api_url("conversation-detail", conversation)).json()["stats"]
    assert stats["archived_message_count"] == 2
    assert stats["summary_count"] == 1
    assert stats["compaction_count"] == 1
    saved = rows[1].token_count + rows[2].token_count - summary.token_count
    assert stats["tokens_saved"] == saved > 0

    transcript = api.get(api_url("message-list", conversation)).json()["results"]
    assert [m["archived"] for m in transcript] == [False, True, True, False, False]
    assert [m["summary_version"] for m in transcript] == [None, 1, 1, None, None]


# --- PATCH --------------------------------------------------------------------------------


def test_patch_title_metadata_model_policy(api, user) -> None:
    conversation = conversation_create(owner=user, title="old", metadata={"a": 1})
    revision = conversation.revision
    response = api.patch(
        api_url("conversation-detail", conversation),
        {
            "title": "new",
            "metadata": {"b": 2},
            "model": "gpt-4",
            "policy": {"trigger": {"messages": 30}, "keep": {"messages": 5}},
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    data = response.json()
    assert (data["title"], data["metadata"], data["model"]) == ("new", {"b": 2}, "gpt-4")
    assert data["policy"] == {
        "trigger": {"messages": 30},
        "keep": {"messages": 5},
        "max_context_tokens": None,
    }
    assert data["effective_policy"] == data["policy"]
    assert data["revision"] > revision
    conversation.refresh_from_db()
    assert (conversation.title, conversation.metadata, conversation.model) == (
        "new",
        {"b": 2},
        "gpt-4",
    )
    assert conversation.trigger == {"messages": 30} and conversation.keep == {"messages": 5}

    # One half of the policy alone; null goes back to the settings' default.
    response = api.patch(
        api_url("conversation-detail", conversation), {"policy": {"trigger": None}}, format="json"
    )
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["policy"] == {"trigger": None, "keep": {"messages": 5}, "max_context_tokens": None}
    assert data["effective_policy"]["trigger"] == ctxsum_settings.TRIGGER


def test_patch_that_changes_nothing_keeps_the_revision(api, user) -> None:
    conversation = conversation_create(owner=user, title="same", system="Sys.")
    response = api.patch(
        api_url("conversation-detail", conversation),
        {"title": "same", "system": "Sys."},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["revision"] == conversation.revision


def test_patch_system_replaces_the_leading_message(api, user) -> None:
    conversation = conversation_create(
        owner=user, system="Old rules.", messages=[user_message("hi"), assistant_message("hello")]
    )
    before = api.get(api_url("context", conversation)).json()

    response = api.patch(
        api_url("conversation-detail", conversation), {"system": "New rules."}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["system"] == "New rules."

    context = api.get(api_url("context", conversation)).json()
    assert context["messages"] == [
        system_message("New rules."),
        user_message("hi"),
        assistant_message("hello"),
    ]
    assert context["revision"] > before["revision"]
    assert context["token_count"] == openai_tokens(context["messages"])

    transcript = api.get(api_url("message-list", conversation)).json()["results"]
    assert [(m["content"], m["replaced"]) for m in transcript] == [
        ("Old rules.", True),
        ("hi", False),
        ("hello", False),
        ("New rules.", False),
    ]
    assert [m["seq"] for m in transcript] == [0, 1, 2, 3]

    conversation.refresh_from_db()
    assert conversation.message_count == 4
    assert conversation.active_message_count == 3
    active = Message.objects.filter(conversation=conversation).active()
    assert conversation.active_tokens == sum(m.token_count for m in active)
    stats = api.get(api_url("conversation-detail", conversation)).json()["stats"]
    assert stats["active_tokens"] == context["token_count"]

    # and a second replacement retires the first replacement
    api.patch(
        api_url("conversation-detail", conversation), {"system": "Newest rules."}, format="json"
    )
    context = api.get(api_url("context", conversation)).json()
    assert context["messages"][0] == system_message("Newest rules.")
    assert len(context["messages"]) == 3


def test_patch_system_adds_one_when_there_was_none(api, user) -> None:
    conversation = conversation_create(
        owner=user, messages=[user_message("hi"), assistant_message("hello")]
    )
    revision = api.get(api_url("context", conversation)).json()["revision"]
    response = api.patch(
        api_url("conversation-detail", conversation), {"system": "Be kind."}, format="json"
    )
    assert response.status_code == 200, response.content
    context = api.get(api_url("context", conversation)).json()
    assert context["messages"] == [
        system_message("Be kind."),
        user_message("hi"),
        assistant_message("hello"),
    ]
    assert context["revision"] > revision
    assert response.json()["system"] == "Be kind."
    # appending afterwards keeps the system message first
    api.post(api_url("message-list", conversation), user_message("more"), format="json")
    assert api.get(api_url("context", conversation)).json()["messages"][0]["content"] == "Be kind."


def test_patch_same_system_text_changes_nothing(api, user) -> None:
    conversation = conversation_create(owner=user, system="Rules.", messages=[user_message("hi")])
    before = api.get(api_url("context", conversation)).json()
    response = api.patch(
        api_url("conversation-detail", conversation), {"system": "Rules."}, format="json"
    )
    assert response.status_code == 200
    after = api.get(api_url("context", conversation)).json()
    assert after == before
    assert Message.objects.filter(conversation=conversation).count() == 2
    assert not Message.objects.filter(replaced_at__isnull=False).exists()


def test_patch_system_over_a_leading_developer_message(api, user) -> None:
    conversation = conversation_create(
        owner=user, messages=[{"role": "developer", "content": "Rules."}, user_message("hi")]
    )
    response = api.patch(
        api_url("conversation-detail", conversation), {"system": "Rules."}, format="json"
    )
    assert response.status_code == 200
    context = api.get(api_url("context", conversation)).json()
    assert context["messages"] == [system_message("Rules."), user_message("hi")]


# --- DELETE -------------------------------------------------------------------------------


def test_delete_removes_everything(api, user) -> None:
    # Two real compactions: summary 1 (inactive) and 2, both with archived messages and an
    # attempt each, beside the tool-call index.
    conversation = compacted_conversation(
        user,
        system="Sys.",
        messages=[long_user_message("a"), CALL, RESULT, assistant_message("b")],
        keep={"messages": 1},
    )
    message_append(
        conversation=conversation, messages=[long_user_message("c"), assistant_message("d")]
    )
    compact(conversation)
    keep = conversation_create(owner=user, messages=[user_message("other")])
    assert list(
        Summary.objects.filter(conversation=conversation)
        .order_by("version")
        .values_list("version", "active")
    ) == [(1, False), (2, True)]
    assert Message.objects.filter(conversation=conversation).archived().count() == 5
    assert CompactionAttempt.objects.filter(conversation=conversation).count() == 2
    assert ToolCall.objects.filter(conversation=conversation).count() == 1

    response = api.delete(api_url("conversation-detail", conversation))
    assert response.status_code == 204
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()
    assert not ToolCall.objects.filter(conversation_id=conversation.pk).exists()
    assert not Summary.objects.filter(conversation_id=conversation.pk).exists()
    assert not CompactionAttempt.objects.filter(conversation_id=conversation.pk).exists()
    assert api.get(api_url("conversation-detail", conversation)).status_code == 404
    assert Message.objects.filter(conversation=keep).count() == 1


# --- appending, transcript, context -------------------------------------------------------


def test_append_one(api, user) -> None:
    conversation = conversation_create(owner=user, system="Sys.")
    response = api.post(
        api_url("message-list", conversation), user_message("Hello there"), format="json"
    )
    assert response.status_code == 201, response.content
    data = response.json()
    assert list(data) == ["messages"] and len(data["messages"]) == 1
    stored = data["messages"][0]
    assert set(stored) >= STORED_KEYS
    assert stored["role"] == "user" and stored["content"] == "Hello there"
    assert stored["seq"] == 1
    assert stored["token_count"] == tokens.count_message(user_message("Hello there"))
    assert stored["archived"] is False
    assert stored["summary_version"] is None
    assert datetime.fromisoformat(stored["created_at"].replace("Z", "+00:00"))


def test_append_batch(api, user) -> None:
    conversation = conversation_create(owner=user)
    batch = [user_message("q"), CALL, RESULT, assistant_message("a")]
    response = api.post(api_url("message-list", conversation), {"messages": batch}, format="json")
    assert response.status_code == 201, response.content
    stored = response.json()["messages"]
    assert [m["seq"] for m in stored] == [0, 1, 2, 3]
    for sent, got in zip(batch, stored, strict=True):
        assert {key: got[key] for key in sent} == sent
        assert got["token_count"] == tokens.count_message(sent)
    conversation.refresh_from_db()
    assert conversation.message_count == conversation.next_seq == 4
    assert conversation.active_tokens == sum(m["token_count"] for m in stored)


def test_transcript_paginated_in_seq_order(api, user) -> None:
    conversation = conversation_create(owner=user, system="Sys.")
    message_append(conversation=conversation, messages=[user_message(f"m{i}") for i in range(11)])
    seqs = []
    page = 1
    while True:
        data = api.get(api_url("message-list", conversation), {"page_size": 5, "page": page}).json()
        assert data["count"] == 12
        seqs += [m["seq"] for m in data["results"]]
        if not data["next"]:
            break
        page += 1
    assert page == 3
    assert seqs == list(range(12))
    first = api.get(api_url("message-list", conversation), {"page_size": 5}).json()["results"]
    assert [m["content"] for m in first] == ["Sys.", "m0", "m1", "m2", "m3"]


def test_context_is_plain_openai_messages(api, user) -> None:
    conversation = conversation_create(
        owner=user,
        system="Sys.",
        messages=[user_message("q", name="bob"), CALL, RESULT],
    )
    data = api.get(api_url("context", conversation)).json()
    assert set(data) == {
        "messages",
        "token_count",
        "summary",
        "revision",
        "over_max_context_tokens",
    }
    assert data["over_max_context_tokens"] is False
    assert data["summary"] is None
    assert data["messages"] == [
        system_message("Sys."),
        user_message("q", name="bob"),
        CALL,
        RESULT,
    ]
    for message in data["messages"]:
        assert not STORED_KEYS & set(message)  # nothing added
    assert data["token_count"] == openai_tokens(data["messages"])


def test_revision_changes_on_every_append(api, user) -> None:
    conversation = conversation_create(owner=user)
    seen = [api.get(api_url("context", conversation)).json()["revision"]]
    for i in range(3):
        api.post(api_url("message-list", conversation), user_message(f"m{i}"), format="json")
        seen.append(api.get(api_url("context", conversation)).json()["revision"])
    api.post(
        api_url("message-list", conversation),
        {"messages": [user_message("x"), assistant_message("y")]},
        format="json",
    )
    seen.append(api.get(api_url("context", conversation)).json()["revision"])
    assert len(set(seen)) == len(seen)
    assert seen == sorted(seen)
    # a rejected append changes nothing
    api.post(api_url("message-list", conversation), {"role": "nobody"}, format="json")
    assert api.get(api_url("context", conversation)).json()["revision"] == seen[-1]


def test_conversation_model_picks_the_encoding(api) -> None:
    text = "def f(x):\n    return {'a': [1, 2, 3]}  # 日本語のコメント 🚀"
    counts = {}
    for model in ("gpt-4", "gpt-4o"):
        pk = api.post(LIST_URL, {"model": model}, format="json").json()["id"]
        stored = api.post(api_url("message-list", pk), user_message(text), format="json").json()[
            "messages"
        ]
        counts[model] = stored[0]["token_count"]
        assert counts[model] == tokens.count_message(user_message(text), model=model)
    assert counts["gpt-4"] != counts["gpt-4o"]


def test_encoding_setting_applies_to_stored_counts(api) -> None:
    text = "def f(x):\n    return {'a': [1, 2, 3]}  # 日本語のコメント 🚀"
    with override_settings(CTXSUM={"ENCODING": "cl100k_base"}):
        pk = api.post(LIST_URL, {"model": "gpt-4o"}, format="json").json()["id"]
        stored = api.post(api_url("message-list", pk), user_message(text), format="json").json()[
            "messages"
        ]
        assert stored[0]["token_count"] == tokens.count_message(user_message(text), model="gpt-4")


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("post", "message-list", user_message("late")),
        ("patch", "conversation-detail", {"system": "late"}),
        ("patch", "conversation-detail", {"title": "late"}),
    ],
)
def test_conversation_deleted_between_lookup_and_write_is_404(
    api, user, monkeypatch, method, url, body
) -> None:
    from ctxsum.api.base import CtxsumView

    conversation = conversation_create(owner=user, system="Sys.")
    lookup = CtxsumView.get_conversation

    def lookup_then_lose_the_race(self):
        found = lookup(self)
        Conversation.objects.filter(pk=found.pk).delete()  # another request's DELETE
        return found

    monkeypatch.setattr(CtxsumView, "get_conversation", lookup_then_lose_the_race)
    response = getattr(api, method)(api_url(url, conversation), body, format="json")
    assert response.status_code == 404
    # the same answer as for any missing conversation
    assert response.json() == api.get(api_url("conversation-detail", conversation)).json()
    assert not Message.objects.exists()
