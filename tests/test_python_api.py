"""The Python API: every write in ctxsum.services, every read in ctxsum.selectors, and one
contract for the conversation passed in: the service re-reads and locks the row itself,
then brings the caller's instance up to date with the row as it left it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from ctxsum import selectors, services
from ctxsum.chat import selectors as chat_selectors
from ctxsum.chat import services as chat_services
from ctxsum.facts import services as fact_services
from ctxsum.models import Conversation
from tests import query_budgets as budget
from tests.factories import OFFLINE_SUMMARIZER, turns

pytestmark = pytest.mark.django_db
LONG = "turn {i}: the traveller wants a morning flight to Delhi with a window seat " * 3

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "python-api.md"


def documented() -> tuple[set[str], set[str]]:
    """The writes and the reads of the Python API table (docs/guide/python-api.md)."""
    section = PAGE.read_text(encoding="utf-8")
    table = section[section.index("| writes") :].split("\n\n", 1)[0]
    writes: set[str] = set()
    reads: set[str] = set()
    for line in table.splitlines()[2:]:
        _, left, right, _ = line.split("|")
        writes |= set(re.findall(r"`([a-z_]+)`", left))
        reads |= set(re.findall(r"`([A-Za-z_]+)`", right))
    return writes, reads


def documented_facts() -> set[str]:
    """The writes the page names under the table, for the optional app ctxsum.facts."""
    section = PAGE.read_text(encoding="utf-8")
    line = section[section.index("`ctxsum.facts.services` adds") :].split("\n\n", 1)[0]
    return set(re.findall(r"`([a-z_]+)`", line.split(":", 1)[1]))


def test_the_facts_app_exports_what_the_page_documents():
    writes = documented_facts()
    assert writes == set(fact_services.__all__) == {"fact_add", "fact_change", "fact_delete"}
    assert not writes & set(services.__all__)
    for name in writes:
        parameters = inspect.signature(getattr(fact_services, name)).parameters.values()
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters), name


def documented_chat(module: str) -> set[str]:
    """The names the page gives under the table for ``module`` of the app ctxsum.chat."""
    section = PAGE.read_text(encoding="utf-8")
    line = section[section.index(f"`{module}` adds") :].split("\n\n", 1)[0]
    return set(re.findall(r"`([A-Za-z_]+)`", line.split(":", 1)[1]))


def test_the_chat_app_exports_what_the_page_documents():
    writes = documented_chat("ctxsum.chat.services")
    expected = {"chat_turn", "achat_turn", "ChatResult", "ChatStream"}
    assert writes == set(chat_services.__all__) == expected
    assert documented_chat("ctxsum.chat.selectors") == set(chat_selectors.__all__)
    core = set(services.__all__) | set(selectors.__all__)
    assert not (writes | set(chat_selectors.__all__)) & core
    parameters = inspect.signature(chat_services.chat_turn).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters)


def test_the_packages_export_what_the_page_documents():
    writes, reads = documented()
    assert {"conversation_create", "message_append", "conversation_compact"} <= writes
    assert writes <= set(services.__all__)
    assert reads == set(selectors.__all__)
    assert all(hasattr(services, name) for name in services.__all__)
    assert all(hasattr(selectors, name) for name in selectors.__all__)


def test_the_documented_writes_take_keywords_only():
    writes, _ = documented()
    for name in writes - {"file_import", "write_db"}:
        parameters = inspect.signature(getattr(services, name)).parameters.values()
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters), name


@pytest.mark.parametrize(
    ("sync", "twin"),
    [
        (services.message_append, services.amessage_append),
        (services.message_pop, services.amessage_pop),
        (services.conversation_restart, services.aconversation_restart),
        (services.conversation_compact, services.aconversation_compact),
        (selectors.context_get, selectors.acontext_get),
        (chat_services.chat_turn, chat_services.achat_turn),
    ],
)
def test_each_async_twin_takes_what_its_sync_function_takes(sync, twin):
    assert inspect.iscoroutinefunction(twin) and not inspect.iscoroutinefunction(sync)
    assert inspect.signature(twin).parameters == inspect.signature(sync).parameters


@pytest.fixture
def conversation(user, settings):
    settings.CTXSUM = {"SUMMARIZER": OFFLINE_SUMMARIZER}
    return services.conversation_create(
        owner=user, system="Sys.", trigger={"messages": 6}, keep={"messages": 2}
    )


def row(conversation: Conversation) -> dict:
    fields = Conversation._meta.concrete_fields
    fresh = Conversation.objects.get(pk=conversation.pk)
    return {f.attname: getattr(fresh, f.attname) for f in fields}


def mine(conversation: Conversation) -> dict:
    return {f.attname: getattr(conversation, f.attname) for f in Conversation._meta.concrete_fields}


def test_every_write_leaves_the_callers_instance_equal_to_the_row(conversation):
    stale = Conversation.objects.get(pk=conversation.pk)  # another copy, left behind
    services.message_append(conversation=conversation, messages=turns(7, LONG))
    assert mine(conversation) == row(conversation)
    assert conversation.message_count == 8 and stale.message_count == 1

    result = services.conversation_compact(conversation=conversation)
    assert result.compacted and result.context.conversation is conversation
    assert mine(conversation) == row(conversation)

    assert services.conversation_update(conversation=conversation, title="New") is conversation
    assert mine(conversation) == row(conversation) and conversation.title == "New"

    services.message_redact(conversation=conversation, seq=7)
    assert mine(conversation) == row(conversation)

    services.conversation_rebuild(conversation=conversation)
    assert mine(conversation) == row(conversation)

    version = selectors.active_summary_version(conversation=conversation)
    assert services.conversation_revert(conversation=conversation, version=version).reverted
    assert mine(conversation) == row(conversation)


def test_a_stale_instance_only_names_the_row(conversation):
    """A service reads the row itself: an outdated instance cannot write old counters."""
    stale = Conversation.objects.get(pk=conversation.pk)
    services.message_append(conversation=conversation, messages=turns(2))
    services.message_append(conversation=stale, messages=turns(1))
    assert stale.message_count == conversation.message_count + 1 == row(stale)["message_count"]


def test_update_saves_only_what_changed(conversation, assert_queries_at_most):
    services.conversation_update(conversation=conversation, title="Same")
    revision = conversation.revision
    with assert_queries_at_most(budget.UPDATE_UNCHANGED):
        services.conversation_update(conversation=conversation, title="Same")
    assert conversation.revision == revision


def test_selectors_hold_every_read():
    reads = {
        "context_get",
        "conversation_list",
        "transcript_list",
        "summary_list",
        "conversation_stats",
        "conversation_policy",
        "conversation_effective_policy",
        "stale_summaries",
        "summary_is_stale",
        "active_summary_version",
    }
    assert all(callable(getattr(selectors, name)) for name in reads)
