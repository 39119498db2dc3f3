"""Key facts beside the summary: the summarizer proposes them in the same call as the
summary (the OpenAI backend over real HTTP against tests/openai_server.py, in both facts
formats, and the offline backend), the compaction merges them by key in its commit, the
context shows them in one block after the summary, the trigger counts that block, and a
revert takes back what its version wrote. The invariants (tests/invariants.py) are checked
after every step."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ctxsum import formatting
from ctxsum.chat.services import chat_turn
from ctxsum.facts import merge as fact_merge
from ctxsum.facts.block import block_message, block_tokens, candidates_limit, conversations_lock
from ctxsum.facts.block import facts_recount as block_recount
from ctxsum.facts.lines import FACTS_HEADER, fact_line, fact_tokens
from ctxsum.facts.merge import CROWDED, SUBJECT_CHANGED
from ctxsum.facts.models import Fact, FactChange
from ctxsum.facts.selectors import conversation_facts
from ctxsum.facts.services import fact_add
from ctxsum.models import Conversation, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import context_get
from ctxsum.services import (
    conversation_compact,
    conversation_create,
    conversation_rebuild,
    conversation_revert,
    conversation_update,
    message_append,
    message_redact,
)
from ctxsum.services.autocompact import compaction_due, over_ceiling
from ctxsum.services.summaries import summary_prompt
from ctxsum.summarizers.base import NO_FACTS
from ctxsum.summarizers.facts import CUT_OFF, NO_FACTS_BLOCK, NOT_STRUCTURED, TOO_DEEP, ProposedFact
from ctxsum.summarizers.offline import OfflineSummarizer
from ctxsum.summarizers.openai import (
    E_BAD_OPTION,
    FACTS_INSTRUCTIONS,
    FACTS_OFF,
    FACTS_SCHEMA,
    OpenAISummarizer,
)
from ctxsum.tokens import count_text
from tests.backends import FactsHookSummarizer, ReplySummarizer
from tests.factories import OFFLINE_SUMMARIZER, assistant_message, long_user_message, user_message
from tests.invariants import assert_context_invariants
from tests.openai_server import fake_summary
from tests.support.urls import api_url

pytestmark = pytest.mark.django_db

SYSTEM = "You are a travel assistant."
POLICY = {"trigger": {"messages": 6}, "keep": {"messages": 2}}
MODEL, PERSON = Fact.ChangedBy.MODEL, Fact.ChangedBy.PERSON
Kind = FactChange.Kind


def history(first: int = 0, count: int = 6) -> list[dict[str, Any]]:
    """Long user messages and short answers in turn, worth summarizing."""
    return [
        long_user_message(f"u{index}") if index % 2 == 0 else assistant_message(f"Noted {index}.")
        for index in range(first, first + count)
    ]


def build(owner: Any, **fields: Any) -> Conversation:
    """A system prompt (seq 0) and six messages (seqs 1-6): a compaction archives 1-4."""
    return conversation_create(owner=owner, system=SYSTEM, messages=history(), **POLICY, **fields)


def facts_format(settings: Any, value: str) -> None:
    options = settings.CTXSUM["SUMMARIZER_OPTIONS"]
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER_OPTIONS": {**options, "facts_format": value}}


def compact(conversation: Conversation) -> Any:
    result = conversation_compact(conversation=conversation, force=True)
    assert result.compacted, result.reason
    assert_context_invariants(conversation)
    return result


def facts_of(conversation: Conversation) -> dict[str, Fact]:
    return {fact.key: fact for fact in Fact.objects.filter(conversation=conversation)}


def person_writes(conversation: Conversation | None, **fields: Any) -> Fact:
    """A person's fact written the way a person's edit is: the conversations showing it
    locked in pk order, the fact written, their blocks recounted."""
    owner = fields.pop("owner", None) or conversation.owner
    subject = fields.get("subject", "")
    with transaction.atomic():
        locked = conversations_lock(
            db="default",
            owner_id=owner.pk,
            subject=subject,
            conversation_id=conversation.pk if conversation is not None else None,
        )
        key, value = fields.pop("key"), fields.pop("value")
        fact, _ = Fact.objects.update_or_create(
            owner=owner,
            conversation=None if subject else conversation,
            subject=subject,
            key=key,
            defaults={
                "value": value,
                "changed_by": fields.pop("changed_by", PERSON),
                "confirmed_at": fields.pop("confirmed_at", timezone.now()),
                "token_count": fact_tokens(key, value),
                "summary": None,
                **fields,
            },
        )
        block_recount(locked)
    return fact


# --------------------------------------------------------------------------- one call


def test_one_structured_call_returns_the_summary_and_its_facts(user, openai_summarizer, settings):
    facts_format(settings, "json_schema")
    openai_summarizer.facts = [
        {"key": "Order ID", "value": "AI-101", "source_seqs": [1]},
        {"key": "email", "value": "ana@example.com", "source_seqs": [3, 1]},
    ]
    conversation = build(user)

    result = compact(conversation)

    # One request, asking for the summary and the facts as one JSON object.
    (request,) = openai_summarizer.requests
    body = request["body"]
    assert body["response_format"] == {"type": "json_schema", "json_schema": FACTS_SCHEMA}
    assert FACTS_INSTRUCTIONS["json_schema"] in body["messages"][0]["content"]
    assert '<user seq="1">' in body["messages"][1]["content"]
    summary = result.summary
    assert summary.text == fake_summary(body["messages"][1]["content"])
    assert summary.facts_skipped == ""
    facts = facts_of(conversation)
    assert sorted(facts) == ["email", "order_id"]
    order = facts["order_id"]
    assert (order.value, order.source_seqs, order.summary, order.changed_by) == (
        "AI-101",
        [1],
        summary,
        MODEL,
    )
    assert order.source_conversation == conversation and order.owner == user
    assert order.token_count == fact_tokens("order_id", "AI-101")
    assert facts["email"].source_seqs == [1, 3]
    changes = FactChange.objects.filter(summary=summary)
    assert list(changes.values_list("kind", "old_value")) == [(Kind.CREATED, "")] * 2
    # The block follows the summary: [system, summary, facts, the kept two].
    context = context_get(conversation=conversation)
    assert len(context.messages) == 5
    block = context.messages[2]
    assert block["role"] == "user" and block["content"].startswith(FACTS_HEADER)
    assert fact_line("order_id", "AI-101") in block["content"]
    conversation.refresh_from_db()
    shown = context.shown("facts")
    assert context.tokens[2] == conversation.facts_tokens == block_tokens(shown) > 0


def test_one_call_returns_the_summary_and_a_tagged_facts_block(user, openai_summarizer):
    openai_summarizer.facts = [{"key": "budget", "value": "400 EUR", "source_seqs": [1]}]
    conversation = build(user)

    result = compact(conversation)

    (request,) = openai_summarizer.requests
    body = request["body"]
    assert "response_format" not in body  # "tagged", the default, works with any server
    assert FACTS_INSTRUCTIONS["tagged"] in body["messages"][0]["content"]
    # The block is not part of the summary.
    assert result.summary.text == fake_summary(body["messages"][1]["content"])
    assert "<facts>" not in result.summary.text
    assert facts_of(conversation)["budget"].value == "400 EUR"


def test_with_facts_off_the_prompt_asks_for_none(user, openai_summarizer, settings):
    facts_format(settings, "off")
    conversation = build(user)

    result = compact(conversation)

    (request,) = openai_summarizer.requests
    assert "response_format" not in request["body"]
    assert all(
        text not in request["body"]["messages"][0]["content"]
        for text in FACTS_INSTRUCTIONS.values()
        if text
    )
    assert result.summary.facts_skipped == FACTS_OFF
    assert not Fact.objects.exists()


def test_a_backend_that_returns_a_plain_summary_still_works(user, settings, monkeypatch):
    monkeypatch.setattr(ReplySummarizer, "reply", "A summary.")
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": "tests.backends.ReplySummarizer"}
    conversation = build(user)

    result = compact(conversation)

    assert result.summary.text == ReplySummarizer.reply
    assert result.summary.facts_skipped == NO_FACTS.format(backend="tests.backends.ReplySummarizer")
    assert not Fact.objects.exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [("xml", "'json_schema' or 'tagged' or 'off'"), (1, "a string")],
)
def test_the_facts_format_option_is_checked(value, message):
    summarizer = OpenAISummarizer(
        model="m", timeout=5, max_tokens=100, options={"facts_format": value, "api_key": "k"}
    )
    errors = summarizer.check()
    assert [error.id for error in errors] == [E_BAD_OPTION]
    assert "facts_format" in errors[0].msg and message in errors[0].msg


# --------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    ("form", "facts", "reason"),
    [
        ("tagged", '[{"key": "order_id", "value": ', "not valid JSON"),
        ("tagged", {"order_id": "AI-101"}, "not a JSON list of objects but an object"),
        ("json_schema", {"order_id": "AI-101"}, "not a JSON list of objects but an object"),
        ("json_schema", [{"key": 5, "value": "x", "source_seqs": [1]}], "Fact 1 has no key"),
        ("tagged", [{"key": "a", "value": "x", "source_seqs": "1"}], "has no source_seqs"),
        ("tagged", [{"key": "a", "value": "", "source_seqs": [1]}], "Fact 1 (a) has no value"),
        # Seq 99 does not exist; seq 0 is the system prompt, never summarized; 5 is kept.
        ("tagged", [{"key": "a", "value": "x", "source_seqs": [99]}], "cites seq 99, outside"),
        ("json_schema", [{"key": "a", "value": "x", "source_seqs": [0]}], "cites seq 0, outside"),
        ("json_schema", [{"key": "a", "value": "x", "source_seqs": [2, 5]}], "seq 5, outside"),
        ("json_schema", [{"key": "a", "value": "x", "source_seqs": []}], "cites no message"),
        ("tagged", None, NO_FACTS_BLOCK),
        # Deeper than the JSON parser recurses: the summary stands all the same.
        ("tagged", "[" * 10_000 + "]" * 10_000, TOO_DEEP),
        ("json_schema", "[" * 10_000 + "]" * 10_000, TOO_DEEP),
        ("json_schema", '[{"key": "a", "value": ' + "[" * 10_000, TOO_DEEP),
    ],
)
def test_malformed_facts_keep_the_summary_and_say_why(
    user, openai_summarizer, settings, form, facts, reason
):
    facts_format(settings, form)
    openai_summarizer.facts = facts
    conversation = build(user)

    result = compact(conversation)

    (request,) = openai_summarizer.requests  # one attempt: nothing is retried
    assert result.summary.text == fake_summary(request["body"]["messages"][1]["content"])
    assert reason in result.summary.facts_skipped, result.summary.facts_skipped
    assert not Fact.objects.exists() and not FactChange.objects.exists()
    assert context_get(conversation=conversation).shown("facts") == []


def test_a_fact_the_database_cannot_store_is_skipped_alone(user, openai_summarizer):
    """A NUL or an unpaired surrogate in a value: PostgreSQL's text refuses both (and
    neither encodes as UTF-8). That fact is skipped; the others of the answer stand."""
    openai_summarizer.facts = [
        {"key": "order_id", "value": "AI-101", "source_seqs": [1]},
        {"key": "note", "value": "a\u0000b", "source_seqs": [1]},
        {"key": "name", "value": "Ana \ud800", "source_seqs": [3]},
        {"key": "email", "value": "ana@example.com", "source_seqs": [3]},
    ]
    conversation = build(user)

    result = compact(conversation)

    assert sorted(facts_of(conversation)) == ["email", "order_id"]
    skipped = result.summary.facts_skipped.splitlines()
    assert [line.split(":")[0] for line in skipped] == ["Fact 2 (note)", "Fact 3 (name)"]


def test_a_server_that_ignores_response_format_gives_a_plain_summary(
    user, openai_summarizer, settings
):
    facts_format(settings, "json_schema")
    openai_summarizer.reply = "The user wants a flight to Delhi."  # prose, not the JSON asked
    conversation = build(user)

    result = compact(conversation)

    assert result.summary.text == "The user wants a flight to Delhi."
    assert result.summary.facts_skipped == NOT_STRUCTURED
    assert not Fact.objects.exists()


@pytest.mark.parametrize(
    ("form", "reply"),
    [
        ("tagged", 'The user wants a flight.\n<facts>[{"key": "a", "val'),
        ("json_schema", '{"summary": "The user wants a flight.", "facts": [{"key": "a", "va'),
    ],
)
def test_facts_cut_off_at_the_token_cap_keep_the_whole_summary(
    user, openai_summarizer, settings, form, reply
):
    facts_format(settings, form)
    openai_summarizer.reply, openai_summarizer.finish_reason = reply, "length"
    conversation = build(user)

    result = compact(conversation)

    assert result.summary.text == "The user wants a flight."
    assert result.summary.facts_skipped == CUT_OFF


# --------------------------------------------------------------------------- merge


def model_writes(conversation: Conversation, key: str, value: str, confirmed_at: Any) -> None:
    """A fact the model wrote from seq 1 of ``conversation``, last confirmed then."""
    person_writes(
        conversation,
        key=key,
        value=value,
        changed_by=MODEL,
        source_seqs=[1],
        source_conversation=conversation,
        confirmed_at=confirmed_at,
    )


def test_a_pinned_or_person_edited_fact_survives_a_model_update(user, openai_summarizer):
    conversation = build(user)
    earlier = timezone.now() - timedelta(hours=1)
    person_writes(conversation, key="seat", value="14A", pinned=True, changed_by=MODEL)
    person_writes(conversation, key="email", value="ana@example.com")
    model_writes(conversation, "budget", "400 EUR", earlier)
    model_writes(conversation, "city", "Delhi", earlier)
    assert_context_invariants(conversation)
    openai_summarizer.facts = [
        {"key": "seat", "value": "15C", "source_seqs": [2]},
        {"key": "email", "value": "bob@example.com", "source_seqs": [2]},
        {"key": "budget", "value": "500 EUR", "source_seqs": [3]},
        {"key": "city", "value": "Delhi", "source_seqs": [3]},
        {"key": "hotel", "value": "near Connaught Place", "source_seqs": [1]},
    ]

    summary = compact(conversation).summary

    facts = facts_of(conversation)
    seat, email, budget, city = facts["seat"], facts["email"], facts["budget"], facts["city"]
    # Pinned, or a person's: the value stays, the model's is only proposed.
    assert (seat.value, seat.proposed_value, seat.proposed_by) == ("14A", "15C", summary)
    assert (email.value, email.proposed_value, email.proposed_by) == (
        "ana@example.com",
        "bob@example.com",
        summary,
    )
    assert email.changed_by == PERSON and email.summary is None
    # The model's own fact is updated; the same value again is confirmed.
    assert (budget.value, budget.source_seqs, budget.summary) == ("500 EUR", [3], summary)
    assert budget.token_count == fact_tokens("budget", "500 EUR")
    assert city.value == "Delhi" and city.source_seqs == [1, 3] and city.confirmed_at > earlier
    assert facts["hotel"].summary == summary
    changes = dict(FactChange.objects.filter(summary=summary).values_list("fact__key", "kind"))
    assert changes == {
        "seat": Kind.PROPOSED,
        "email": Kind.PROPOSED,
        "budget": Kind.UPDATED,
        "city": Kind.CONFIRMED,
        "hotel": Kind.CREATED,
    }
    old = FactChange.objects.get(summary=summary, fact=budget)
    assert (old.old_value, old.old_source_seqs, old.old_confirmed_at) == ("400 EUR", [1], earlier)


def test_a_confirmation_writes_only_what_it_changes(user, openai_summarizer):
    """Confirming two facts with their new seqs sets the fields they share in one statement
    and their seqs in another; neither rewrites a value."""
    conversation = build(user)
    earlier = timezone.now() - timedelta(hours=1)
    model_writes(conversation, "city", "Delhi", earlier)
    model_writes(conversation, "budget", "400 EUR", earlier)
    openai_summarizer.facts = [
        {"key": "city", "value": "Delhi", "source_seqs": [3]},
        {"key": "budget", "value": "400 EUR", "source_seqs": [2]},
    ]

    with CaptureQueriesContext(connection) as queries:
        compact(conversation)

    updates = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "ctxsum_fact"')
    ]
    assert len(updates) == 2
    assert not any('"value" =' in sql or '"summary_id" =' in sql for sql in updates)
    facts = facts_of(conversation)
    assert (facts["city"].source_seqs, facts["budget"].source_seqs) == ([1, 3], [1, 2])
    assert facts["city"].confirmed_at == facts["budget"].confirmed_at > earlier
    assert_context_invariants(conversation)


def test_the_offline_extractor_confirms_a_fact_it_finds_again(user, settings):
    """Keys are stable: the same identifier found by a later compaction is the same fact,
    confirmed, with the seqs of both."""
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": OFFLINE_SUMMARIZER}
    conversation = build(user)
    more = [user_message("My order is AI-101."), assistant_message("Noted."), user_message("ok")]
    message_append(conversation=conversation, messages=more)  # seqs 7-9
    first = compact(conversation).summary  # archives 1-7
    message_append(
        conversation=conversation,
        messages=[
            user_message("Any news on AI-101? Write to ana@example.com."),
            assistant_message("Checking."),
            user_message("Thanks."),
        ],
    )  # seqs 10-12

    second = compact(conversation).summary  # archives 8-10

    order = Fact.objects.get(conversation=conversation, key="identifier:ai-101")
    assert order.value == "AI-101" and order.source_seqs == [7, 10]
    assert order.summary == first  # written by the first, confirmed by the second
    kinds = FactChange.objects.filter(fact=order).order_by("id").values_list("summary", "kind")
    assert list(kinds) == [(first.pk, Kind.CREATED), (second.pk, Kind.CONFIRMED)]
    email = Fact.objects.get(conversation=conversation, key="email:ana@example.com")
    assert (email.value, email.source_seqs, email.summary) == ("ana@example.com", [10], second)


def test_the_offline_extraction_is_deterministic():
    messages = [
        user_message("I'm Ana Lopez, order AI-101, refund of $1,200 by October 20."),
        assistant_message("Noted, Ana. I'll write to ana@example.com."),
        user_message("Also 2024-05-01 for the Lisbon trip."),
    ]
    history = formatting.with_summary_so_far(
        "Earlier: order ZZ-999 for Bob.", formatting.format_messages(messages, seqs=[4, 5, 6])
    )
    summarizer = OfflineSummarizer(model="gpt-4o-mini", timeout=60, max_tokens=1024)
    call = {"prompt": "p", "history": history, "model": "gpt-4o-mini", "budget": 500}

    first, second = summarizer.answer(**call), summarizer.answer(**call)

    assert first == second
    found = {fact.key: (fact.value, fact.source_seqs) for fact in first.facts}
    assert found == {
        "name:ana lopez": ("Ana Lopez", (4,)),
        "identifier:ai-101": ("AI-101", (4,)),
        "amount:1200": ("$1,200", (4,)),
        "date:october 20": ("October 20", (4,)),
        "name:ana": ("Ana", (5,)),
        "email:ana@example.com": ("ana@example.com", (5,)),
        "date:2024-05-01": ("2024-05-01", (6,)),
        "name:lisbon": ("Lisbon", (6,)),
    }
    # Nothing of the summary so far (ZZ-999, Bob): a fact cites the message it is in.
    assert first.summary == summarizer.summarize(**call)
    # A history whose messages name no seq gives no facts: none could cite its message.
    plain = {**call, "history": formatting.format_messages(messages)}
    assert summarizer.answer(**plain).facts == ()


# --------------------------------------------------------------------------- subjects


def test_a_subjects_facts_reach_every_conversation_of_its_owner_naming_it(
    user, other_user, openai_summarizer
):
    first = build(user, subject="customer-42")
    sibling = conversation_create(owner=user, subject="customer-42", system=SYSTEM)
    elsewhere = conversation_create(owner=user, subject="customer-7")
    strangers = conversation_create(owner=other_user, subject="customer-42")
    revision = sibling.revision
    openai_summarizer.facts = [{"key": "plan", "value": "gold", "source_seqs": [2]}]

    compact(first)

    fact = Fact.objects.get(key="plan")
    assert (fact.conversation, fact.subject, fact.owner) == (None, "customer-42", user)
    assert fact.source_conversation == first
    # The sibling was shown the new fact in the same transaction: its counters moved.
    sibling.refresh_from_db()
    assert sibling.facts_tokens > 0 and sibling.revision == revision + 1
    # A new conversation naming the subject starts with the block, right after its prompt.
    new = conversation_create(owner=user, subject="customer-42", messages=[user_message("Hi")])
    context = context_get(conversation=new)
    assert context.messages[0] == block_message([fact])
    assert context.messages[1] == user_message("Hi")
    assert new.facts_tokens == context.tokens[0] == block_tokens([fact])
    for conversation in (first, sibling, new, elsewhere, strangers):
        assert_context_invariants(conversation)
    # Not another subject's, not another owner's.
    assert context_get(conversation=elsewhere).shown("facts") == []
    assert context_get(conversation=strangers).shown("facts") == []


def test_a_subject_fact_the_model_changes_moves_every_showing_conversations_revision(
    user, openai_summarizer
):
    """The value goes from "gold" to "blue", which cost the same tokens: the sibling's block
    keeps its size, not its text, so its revision moves all the same."""
    assert fact_tokens("plan", "gold") == fact_tokens("plan", "blue")
    first = build(user, subject="customer-42")
    second = build(user, subject="customer-42")
    sibling = conversation_create(owner=user, subject="customer-42", system=SYSTEM)
    openai_summarizer.facts = [{"key": "plan", "value": "gold", "source_seqs": [2]}]
    compact(first)
    sibling.refresh_from_db()
    block, revision = sibling.facts_tokens, sibling.revision
    openai_summarizer.facts = [{"key": "plan", "value": "blue", "source_seqs": [2]}]

    version = compact(second).summary.version

    assert Fact.objects.get(key="plan").value == "blue"
    sibling.refresh_from_db()
    assert (sibling.facts_tokens, sibling.revision) == (block, revision + 1)
    first.refresh_from_db()
    revisions = first.revision
    # And back: the revert of that version changes the text again.
    conversation_revert(conversation=second, version=version)
    assert Fact.objects.get(key="plan").value == "gold"
    sibling.refresh_from_db()
    first.refresh_from_db()
    assert (sibling.revision, first.revision) == (revision + 2, revisions + 1)
    for conversation in (first, second, sibling):
        assert_context_invariants(conversation)


def test_a_subjects_fact_costs_the_same_whichever_conversation_wrote_it(user, openai_summarizer):
    """A subject's fact is shown to conversations of any model: its ``token_count`` is
    counted with DEFAULT_MODEL's encoding, as when a person writes it; a conversation's own
    fact with the conversation's model."""
    value = "Zürich, Schweiz — Bahnhofstraße 12"
    assert fact_tokens("address", value, model="gpt-4") != fact_tokens("address", value)
    subject = build(user, subject="customer-42", model="gpt-4")
    own = build(user, model="gpt-4")
    openai_summarizer.facts = [{"key": "address", "value": value, "source_seqs": [1]}]

    compact(subject)
    compact(own)

    shared = Fact.objects.get(subject="customer-42")
    assert shared.token_count == fact_tokens("address", value)
    assert facts_of(own)["address"].token_count == fact_tokens("address", value, model="gpt-4")
    person = fact_add(user=user, subject="customer-42", key="city", value=value)
    assert person.token_count == fact_tokens("city", value)


def test_a_conversation_that_takes_a_subject_shows_its_facts(user):
    fact = person_writes(None, owner=user, subject="acme", key="vat", value="ES-B123")
    conversation = conversation_create(owner=user, messages=[user_message("Hi")])
    assert context_get(conversation=conversation).shown("facts") == []

    conversation_update(conversation=conversation, subject="acme")

    assert context_get(conversation=conversation).shown("facts") == [fact]
    assert conversation.facts_tokens == block_tokens([fact])
    assert_context_invariants(conversation)
    conversation_update(conversation=conversation, subject="")
    assert conversation.facts_tokens == 0
    assert_context_invariants(conversation)


def test_a_subject_changed_during_the_call_skips_the_facts_not_the_summary(
    user, settings, monkeypatch
):
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": "tests.backends.FactsHookSummarizer"}
    monkeypatch.setattr(
        FactsHookSummarizer, "facts", (ProposedFact(key="plan", value="gold", source_seqs=(1,)),)
    )
    conversation = build(user, subject="customer-42")
    FactsHookSummarizer.during = lambda: conversation_update(  # taken by the call
        conversation=Conversation.objects.get(pk=conversation.pk), subject="customer-7"
    )

    result = compact(conversation)

    assert result.summary.text == FactsHookSummarizer.reply
    assert result.summary.facts_skipped == SUBJECT_CHANGED
    assert not Fact.objects.exists()


# --------------------------------------------------------------------------- the block


def test_the_block_keeps_pinned_facts_first_within_facts_max_tokens(
    user, openai_summarizer, settings
):
    settings.CTXSUM = {**settings.CTXSUM, "FACTS_MAX_TOKENS": 60}
    conversation = build(user)
    pinned = person_writes(
        conversation,
        key="allergy",
        value="peanuts",
        pinned=True,
        confirmed_at=timezone.now() - timedelta(days=30),
    )
    openai_summarizer.facts = [
        {"key": f"detail_{index}", "value": f"value number {index}", "source_seqs": [1]}
        for index in range(15)
    ]

    compact(conversation)

    assert Fact.objects.filter(conversation=conversation).count() == 16
    context = context_get(conversation=conversation)
    assert context.shown("facts")[0] == pinned  # the oldest, but pinned
    assert 1 < len(context.shown("facts")) < 16
    assert context.tokens[2] == block_tokens(context.shown("facts")) <= 60
    lines = context.messages[2]["content"].splitlines()
    assert lines[:2] == [FACTS_HEADER, fact_line("allergy", "peanuts")]


def test_facts_that_would_grow_the_context_past_the_gain_are_left_out(user, settings, monkeypatch):
    """The compaction must leave a smaller context than it found, the block included."""
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARIZER": "tests.backends.FactsHookSummarizer"}
    conversation = build(user)
    before = context_get(conversation=conversation).token_count
    proposed = tuple(
        ProposedFact(key=f"k{index}", value="a long value " * 5, source_seqs=(1,))
        for index in range(20)
    )
    monkeypatch.setattr(FactsHookSummarizer, "facts", proposed)

    result = compact(conversation)

    assert result.context.token_count < before
    stored = Fact.objects.filter(conversation=conversation).count()
    assert 0 < stored < 20
    assert result.summary.facts_skipped == CROWDED.format(count=20 - stored)


def test_the_trigger_counts_the_block(user, settings):
    """Messages alone below the token trigger, with the facts block at it: the append's
    check finds a compaction due, and a compaction that is not forced compacts. (The block
    may take the whole trigger: at its default share, a trigger this small leaves it none.)"""
    settings.CTXSUM = {
        **settings.CTXSUM,
        "SUMMARIZER": OFFLINE_SUMMARIZER,
        "FACTS_TRIGGER_SHARE": 1,
    }
    for index in range(6):
        person_writes(
            None, owner=user, subject="acme", key=f"contract_{index}", value=f"C-{index} " * 4
        )
    conversation = conversation_create(owner=user, subject="acme", system=SYSTEM)
    message_append(conversation=conversation, messages=history())
    block = conversation.facts_tokens
    assert block > 0
    trigger = conversation.context_tokens - block // 2
    conversation_update(conversation=conversation, trigger={"tokens": trigger})
    assert conversation.context_tokens - block < trigger <= conversation.context_tokens
    assert compaction_due(conversation) and not over_ceiling(conversation)

    result = conversation_compact(conversation=conversation)

    assert result.compacted and result.reason == Reason.COMPACTED
    # The block is pinned like the summary: [system, summary, facts, kept].
    assert result.context.messages[2]["content"].startswith(FACTS_HEADER)
    assert_context_invariants(conversation)


def test_the_context_endpoint_and_the_chat_turn_send_the_block(user, api, chat_model):
    person_writes(None, owner=user, subject="acme", key="vat", value="ES-B123")
    conversation = conversation_create(
        owner=user, subject="acme", system=SYSTEM, messages=[user_message("Hi")]
    )

    data = api.get(api_url("context", conversation)).json()

    assert data["messages"][1]["content"] == f"{FACTS_HEADER}\n- vat: ES-B123"
    assert data["token_count"] == conversation.context_tokens
    chat_turn(conversation=conversation, message=user_message("What is my VAT number?"))
    (request,) = chat_model.requests
    assert request["body"]["messages"][1] == data["messages"][1]
    assert_context_invariants(conversation)


# --------------------------------------------------------------------------- revert


# What the model proposes at the second compaction of the revert test (it archives 5-8).
SECOND_FACTS = [
    {"key": "flight", "value": "LH 1172", "source_seqs": [5]},
    {"key": "seat", "value": "15C", "source_seqs": [5]},
    {"key": "city", "value": "Delhi", "source_seqs": [6]},
    {"key": "hotel", "value": "Imperial", "source_seqs": [7]},
    {"key": "transfer", "value": "both ways", "source_seqs": [8]},
    {"key": "meal", "value": "vegan", "source_seqs": [8]},
]


def test_a_revert_takes_back_the_facts_its_version_wrote(user, openai_summarizer):
    conversation = build(user)
    openai_summarizer.facts = [
        {"key": "flight", "value": "TP 537", "source_seqs": [1]},
        {"key": "seat", "value": "14A", "source_seqs": [1]},
        {"key": "city", "value": "Delhi", "source_seqs": [2]},
    ]
    first = compact(conversation).summary
    before = {fact.key: fact for fact in Fact.objects.all()}
    pinned = person_writes(conversation, key="meal", value="vegetarian", pinned=True)
    message_append(conversation=conversation, messages=history(7, 4))  # seqs 7-10
    openai_summarizer.facts = SECOND_FACTS
    second = compact(conversation).summary
    facts = facts_of(conversation)
    assert (facts["flight"].value, facts["seat"].value) == ("LH 1172", "15C")
    assert facts["meal"].proposed_value == "vegan"
    # A person edits the seat and pins the transfer the second version wrote.
    person_writes(conversation, key="seat", value="16F")
    person_writes(conversation, key="transfer", value="both ways", pinned=True, changed_by=MODEL)

    reverted = conversation_revert(conversation=conversation, version=second.version)

    assert reverted.reverted and reverted.summary == first
    facts = facts_of(conversation)
    assert "hotel" not in facts  # created by the reverted version
    flight = facts["flight"]  # changed by it: the old value, source and confirmation back
    old = before["flight"]
    assert (flight.value, flight.source_seqs, flight.summary, flight.confirmed_at) == (
        old.value,
        old.source_seqs,
        first,
        old.confirmed_at,
    )
    assert flight.token_count == old.token_count
    assert facts["city"].confirmed_at == before["city"].confirmed_at
    assert facts["city"].source_seqs == [2]
    # A person's since: theirs to keep.
    assert (facts["seat"].value, facts["seat"].changed_by) == ("16F", PERSON)
    assert facts["transfer"].pinned and facts["transfer"].value == "both ways"
    # The proposal the reverted version made is withdrawn; the pinned value never moved.
    meal = facts["meal"]
    assert (meal.value, meal.proposed_value, meal.proposed_by) == ("vegetarian", "", None)
    assert meal == pinned
    assert_context_invariants(conversation)


def test_a_subjects_fact_another_conversation_confirmed_outlives_a_revert(user, openai_summarizer):
    first = build(user, subject="customer-42")
    second = build(user, subject="customer-42")
    openai_summarizer.facts = [
        {"key": "plan", "value": "gold", "source_seqs": [1]},
        {"key": "phone", "value": "555-0101", "source_seqs": [1]},
    ]
    version = compact(first).summary.version
    openai_summarizer.facts = [{"key": "plan", "value": "gold", "source_seqs": [2]}]
    compact(second)

    conversation_revert(conversation=first, version=version)

    # The second conversation found the plan too: it stays; the phone only the first had.
    plan = Fact.objects.get(subject="customer-42")
    assert (plan.key, plan.source_conversation, plan.source_seqs) == ("plan", second, [2])
    for conversation in (first, second):
        assert_context_invariants(conversation)


def test_a_confirmation_another_conversation_made_since_outlives_a_revert(user, openai_summarizer):
    """The first conversation writes the fact, the second confirms it, the third confirms
    it again: reverting the second's version leaves the third's confirmation."""
    first, second, third = (build(user, subject="customer-42") for _ in range(3))
    openai_summarizer.facts = [{"key": "plan", "value": "gold", "source_seqs": [1]}]
    compact(first)
    openai_summarizer.facts = [{"key": "plan", "value": "gold", "source_seqs": [2]}]
    version = compact(second).summary.version
    openai_summarizer.facts = [{"key": "plan", "value": "gold", "source_seqs": [3]}]
    compact(third)
    confirmed = Fact.objects.get(subject="customer-42")

    conversation_revert(conversation=second, version=version)

    plan = Fact.objects.get(subject="customer-42")
    assert (plan.source_conversation, plan.source_seqs) == (third, [3])
    assert plan.confirmed_at == confirmed.confirmed_at
    for conversation in (first, second, third):
        assert_context_invariants(conversation)


def test_a_rebuild_confirms_facts_and_its_revert_takes_that_back(user, openai_summarizer, settings):
    conversation = build(user)
    openai_summarizer.facts = [{"key": "city", "value": "Delhi", "source_seqs": [2]}]
    compact(conversation)
    city = Fact.objects.get(key="city")
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    openai_summarizer.facts = [{"key": "city", "value": "Delhi", "source_seqs": [1, 2]}]

    rebuilt = conversation_rebuild(conversation=conversation)

    assert rebuilt.rebuilt
    assert_context_invariants(conversation)
    confirmed = Fact.objects.get(pk=city.pk)
    assert confirmed.source_seqs == [1, 2] and confirmed.confirmed_at > city.confirmed_at
    assert FactChange.objects.get(summary=rebuilt.summary).kind == Kind.CONFIRMED

    conversation_revert(conversation=conversation, version=rebuilt.summary.version)

    back = Fact.objects.get(pk=city.pk)
    assert (back.source_seqs, back.confirmed_at) == ([2], city.confirmed_at)
    assert_context_invariants(conversation)


# --------------------------------------------------------------------------- locks


@pytest.fixture
def subject_locks(monkeypatch: Any) -> list[dict[str, Any]]:
    """The locks of a subject's conversations that commits take (``facts_lock``)."""
    taken: list[dict[str, Any]] = []
    original = fact_merge.conversations_lock

    def spy(**kwargs: Any) -> Any:
        taken.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(fact_merge, "conversations_lock", spy)
    return taken


def test_a_commit_with_no_facts_to_write_locks_only_its_own_row(
    user, openai_summarizer, settings, subject_locks
):
    """Compaction, rebuild, revert and redaction lock every conversation of the subject
    only when they write facts: a summary without facts, a version that wrote none, a
    message no fact cites need the conversation's own row alone."""
    conversation = build(user, subject="customer-42")
    conversation_create(owner=user, subject="customer-42")
    openai_summarizer.facts = []
    version = compact(conversation).summary.version
    message_redact(conversation=conversation, seq=2)
    conversation_revert(conversation=conversation, version=version)
    assert subject_locks == []

    openai_summarizer.facts = [{"key": "plan", "value": "gold", "source_seqs": [1]}]
    compact(conversation)
    assert len(subject_locks) == 1
    message_redact(conversation=conversation, seq=3)  # no fact cites it
    assert len(subject_locks) == 1
    message_redact(conversation=conversation, seq=1)
    assert len(subject_locks) == 2 and not Fact.objects.exists()
    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    openai_summarizer.facts = []
    rebuilt = conversation_rebuild(conversation=conversation)
    assert rebuilt.rebuilt
    conversation_revert(conversation=conversation, version=rebuilt.summary.version)
    assert len(subject_locks) == 2
    assert_context_invariants(conversation)


# --------------------------------------------------------------------------- chunks


def test_every_chunks_facts_are_merged(user, openai_summarizer, settings):
    """A history larger than one call's input budget: each call proposes the facts of its
    chunk, a later call's value winning."""
    prompt = count_text(summary_prompt(1000, FACTS_INSTRUCTIONS["tagged"]))
    room = 300  # tokens of history per call: a few messages
    budget = settings.CTXSUM.get("SUMMARY_MAX_TOKENS", 1024) + prompt + room
    settings.CTXSUM = {**settings.CTXSUM, "SUMMARY_INPUT_BUDGET": budget}
    conversation = conversation_create(
        owner=user, messages=history(0, 12), trigger={"messages": 12}, keep={"messages": 2}
    )
    openai_summarizer.script = [
        {"facts": [{"key": "first", "value": "a", "source_seqs": [0]}]},
        {"facts": [{"key": "later", "value": "b", "source_seqs": [9]}]},
        {"facts": [{"key": "later", "value": "c", "source_seqs": [9]}]},
        {"facts": [{"key": "later", "value": "d", "source_seqs": [9]}]},
    ]

    result = compact(conversation)

    calls = len(openai_summarizer.requests)
    assert calls > 1
    facts = facts_of(conversation)
    assert facts["first"].value == "a"
    assert facts["later"].value == "bcd"[calls - 2]
    assert result.summary.facts_skipped == ""


def test_the_stored_summary_says_when_no_fact_was_skipped(user, openai_summarizer):
    openai_summarizer.facts = []
    conversation = build(user)

    summary = compact(conversation).summary

    assert Summary.objects.get(pk=summary.pk).facts_skipped == ""
    assert not Fact.objects.exists()


# --------------------------------------------------------------------------- redaction


def test_redacting_a_message_deletes_the_models_facts_taken_from_it(user, openai_summarizer):
    conversation = build(user, subject="customer-42")
    sibling = conversation_create(owner=user, subject="customer-42")
    openai_summarizer.facts = [
        {"key": "email", "value": "ana@example.com", "source_seqs": [1]},
        {"key": "phone", "value": "555-0101", "source_seqs": [1, 3]},
        {"key": "city", "value": "Delhi", "source_seqs": [3]},
    ]
    compact(conversation)
    person_writes(
        None,
        owner=user,
        subject="customer-42",
        key="phone",
        value="555-0101",
        pinned=True,
        changed_by=MODEL,
    )

    message_redact(conversation=conversation, seq=1)

    assert sorted(Fact.objects.values_list("key", flat=True)) == ["city", "phone"]
    for each in (conversation, sibling):
        assert_context_invariants(each)
    assert "ana@example.com" not in str(context_get(conversation=sibling).messages)


def test_redaction_leaves_the_text_nowhere_in_the_facts_nor_their_history(user, openai_summarizer):
    """The first version takes the e-mail from message 1, the second changes it (from
    message 5) and proposes a meal for a person's fact. Redacting message 1 scrubs the old
    e-mail from the second version's record, so reverting it cannot bring it back, and
    withdraws the proposal of every version covering the message."""
    conversation = build(user, subject="customer-42")
    sibling = conversation_create(owner=user, subject="customer-42")
    fact_add(user=user, subject="customer-42", key="meal", value="vegetarian")
    openai_summarizer.facts = [
        {"key": "email", "value": "ana.old@example.com", "source_seqs": [1]},
        {"key": "city", "value": "Delhi", "source_seqs": [3]},
    ]
    compact(conversation)
    message_append(conversation=conversation, messages=history(7, 4))  # seqs 7-10
    openai_summarizer.facts = [
        {"key": "email", "value": "ana.new@example.com", "source_seqs": [5]},
        {"key": "meal", "value": "no peanuts at all", "source_seqs": [5]},
    ]
    second = compact(conversation).summary
    assert Fact.objects.get(key="meal").proposed_value == "no peanuts at all"

    message_redact(conversation=conversation, seq=1)
    conversation_revert(conversation=conversation, version=second.version)

    def stored() -> str:
        rows = [*Fact.objects.values(), *FactChange.objects.values()]
        return str(rows)

    assert "ana.old@example.com" not in stored()
    assert "no peanuts at all" not in stored()
    # The e-mail the reverted version wrote is gone too: nothing of it is left to show.
    assert sorted(Fact.objects.values_list("key", flat=True)) == ["city", "meal"]
    assert not Fact.objects.filter(value="").exists()
    for each in (conversation, sibling):
        assert_context_invariants(each)


def test_the_block_is_chosen_from_a_bounded_read(user, settings):
    """However many facts a conversation gathered, its context reads as many as a block
    could show (pinned first, then the most recently confirmed)."""
    settings.CTXSUM = {**settings.CTXSUM, "FACTS_MAX_TOKENS": 40}
    conversation = conversation_create(owner=user, messages=[user_message("Hi")])
    now = timezone.now()
    Fact.objects.bulk_create(
        Fact(
            owner=user,
            conversation=conversation,
            key=f"k{index:03d}",
            value="v",
            confirmed_at=now - timedelta(seconds=index),
            token_count=fact_tokens(f"k{index:03d}", "v"),
        )
        for index in range(200)
    )
    person_writes(
        conversation,
        key="oldest",
        value="pinned",
        pinned=True,
        confirmed_at=now - timedelta(days=1),
    )

    with CaptureQueriesContext(connection) as queries:
        context = context_get(conversation=conversation)

    assert len(queries) == 3
    assert f"LIMIT {candidates_limit()}" in queries.captured_queries[2]["sql"]
    assert candidates_limit() == 28
    keys = [fact.key for fact in context.shown("facts")]
    assert keys[:3] == ["oldest", "k000", "k001"] and block_tokens(context.shown("facts")) <= 40
    assert_context_invariants(conversation)


def test_in_context_says_what_the_block_shows(user, settings):
    """Long facts, confirmed last, fill the read the block is chosen from, none of them
    fitting; a short one behind them would fit. The block shows none, and the list of
    facts must not say otherwise."""
    settings.CTXSUM = {**settings.CTXSUM, "FACTS_MAX_TOKENS": 40}
    conversation = conversation_create(owner=user, messages=[user_message("Hi")])
    now = timezone.now()
    long = "a value far too long for a block of forty tokens " * 2
    Fact.objects.bulk_create(
        Fact(
            owner=user,
            conversation=conversation,
            key=f"k{index:03d}",
            value=long,
            confirmed_at=now - timedelta(seconds=index),
            token_count=fact_tokens(f"k{index:03d}", long),
        )
        for index in range(candidates_limit())
    )
    short = person_writes(
        conversation, key="short", value="v", confirmed_at=now - timedelta(days=1)
    )

    seen = conversation_facts(conversation=conversation)

    shown = context_get(conversation=conversation).shown("facts")
    assert shown == []
    assert short.pk not in seen.shown
    assert seen.shown == {fact.pk for fact in shown}
