"""A person's writes to key facts (ctxsum.facts.services): what they store, the errors that
name the field, the counters and revision of every conversation showing the fact, the lock
order, and on PostgreSQL the race between a subject's fact and a conversation starting to
name that subject."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ctxsum.facts.block import block_tokens, facts_chosen, facts_visible
from ctxsum.facts.lines import fact_tokens
from ctxsum.facts.models import Fact
from ctxsum.facts.services import fact_add, fact_change, fact_delete
from ctxsum.models import Conversation
from ctxsum.services import conversation_create, conversation_delete, conversation_update
from ctxsum.services.conversations import subject_problem
from tests import query_budgets as budget
from tests.factories import turns
from tests.postgres import POSTGRES, blocked, start, wait_until

SUBJECT = "customer-42"


def block(conversation: Conversation) -> int:
    row = Conversation.objects.get(pk=conversation.pk)
    model = row.model or None
    return block_tokens(facts_chosen(facts_visible(row), model=model), model=model)


def state(conversation: Conversation) -> tuple[int, int, int]:
    row = Conversation.objects.get(pk=conversation.pk)
    return row.active_tokens, row.facts_tokens, row.revision


def without_block(conversation: Conversation) -> int:
    """The active tokens of the messages (and summary) alone."""
    active, facts_tokens, _ = state(conversation)
    return active - facts_tokens


@pytest.mark.django_db
class TestWrites:
    def test_add_stores_a_persons_fact_and_counts_it(self, user):
        conversation = conversation_create(owner=user, model="gpt-4o", messages=turns(2))
        messages = without_block(conversation)

        fact = fact_add(user=user, conversation=conversation, key="seat ", value="\t14A\n")

        fact.refresh_from_db()
        assert (fact.key, fact.value, fact.owner, fact.subject) == ("seat", "14A", user, "")
        assert (fact.changed_by, fact.changed_by_user, fact.summary) == ("person", user, None)
        assert fact.token_count == fact_tokens("seat", "14A", model="gpt-4o")
        assert state(conversation) == (messages + block(conversation), block(conversation), 2)
        assert conversation.revision == 2 and conversation.facts_tokens == block(conversation)

    def test_a_persons_key_is_normalized_like_the_models(self, user):
        """A person's "Order ID" and the summarizer's "order_id" are one fact."""
        conversation = conversation_create(owner=user, subject=SUBJECT)

        fact = fact_add(user=user, subject=SUBJECT, key=" Order ID", value="AI-101")

        assert fact.key == "order_id"
        for key in ("order-id", "ORDER_ID"):
            with pytest.raises(ValidationError) as raised:
                fact_add(user=user, subject=SUBJECT, key=key, value="AI-102")
            assert list(raised.value.message_dict) == ["key"]
        fact_change(fact=fact, user=user, key="Order number")
        assert fact.key == "order_number"
        with pytest.raises(ValidationError) as raised:
            fact_add(user=user, conversation=conversation, key="!!!", value="v")
        assert list(raised.value.message_dict) == ["key"]

    def test_a_staff_members_fact_still_belongs_to_the_conversations_owner(self, user, other_user):
        conversation = conversation_create(owner=user)
        fact = fact_add(user=other_user, conversation=conversation, key="k", value="v")
        assert (fact.owner, fact.changed_by_user) == (user, other_user)

    @pytest.mark.parametrize(
        ("fields", "errors"),
        [
            ({"key": "", "value": ""}, {"key", "value"}),
            ({"key": 1, "value": "v", "pinned": "no"}, {"key", "pinned"}),
            ({"key": "a\rb", "value": "v"}, {"key"}),
            ({"key": "k", "value": "v", "subject": ""}, {"subject"}),
            ({"key": "k", "value": "v", "subject": "  x"}, {"subject"}),
            ({"key": "k", "value": "v", "subject": None}, {"subject"}),
        ],
    )
    def test_bad_input_names_its_fields_and_stores_nothing(self, user, fields, errors):
        with pytest.raises(ValidationError) as raised:
            fact_add(user=user, **fields)
        assert set(raised.value.message_dict) == errors
        assert not Fact.objects.exists()

    def test_a_fact_is_a_conversations_or_a_subjects_not_both(self, user):
        conversation = conversation_create(owner=user, subject=SUBJECT)
        with pytest.raises(ValidationError) as raised:
            fact_add(user=user, conversation=conversation, subject=SUBJECT, key="k", value="v")
        assert list(raised.value.message_dict) == ["subject"]

    def test_change_writes_what_is_given_and_moves_each_showing_conversation_once(self, user):
        shown = [conversation_create(owner=user, subject=SUBJECT) for _ in range(3)]
        elsewhere = conversation_create(owner=user, subject="another")
        fact = fact_add(user=user, subject=SUBJECT, key="name", value="Maria")
        before = {c.pk: state(c) for c in (*shown, elsewhere)}

        fact_change(fact=fact, user=user, pinned=True)

        assert fact.pinned and fact.changed_by == "person"
        for conversation in shown:
            assert state(conversation)[2] == before[conversation.pk][2] + 1
        assert state(elsewhere) == before[elsewhere.pk]
        fact_change(fact=fact, user=user, value="Maria Lopes", key="full name")
        for conversation in shown:
            _, facts_tokens, revision = state(conversation)
            assert facts_tokens == block(conversation)
            assert revision == before[conversation.pk][2] + 2

    def test_nothing_given_writes_nothing(self, user, assert_queries_at_most):
        fact = fact_add(user=user, subject=SUBJECT, key="k", value="v")
        with assert_queries_at_most(budget.FACT_UNCHANGED):
            assert fact_change(fact=fact, user=user) is fact

    def test_a_fact_deleted_meanwhile(self, user):
        conversation = conversation_create(owner=user)
        fact = fact_add(user=user, conversation=conversation, key="k", value="v")
        stale = Fact.objects.get(pk=fact.pk)
        fact_delete(fact=fact, user=user)
        with pytest.raises(Fact.DoesNotExist):
            fact_change(fact=stale, user=user, value="w")
        fact_delete(fact=stale, user=user)  # no error: someone got there first
        assert state(conversation) == (0, 0, 2)

    def test_a_conversation_deleted_meanwhile(self, user):
        conversation = conversation_create(owner=user)
        conversation_delete(conversation=Conversation.objects.get(pk=conversation.pk))
        with pytest.raises(Conversation.DoesNotExist):
            fact_add(user=user, conversation=conversation, key="k", value="v")
        assert not Fact.objects.exists()

    def test_a_new_model_recounts_the_block_with_its_encoding(self, user):
        conversation = conversation_create(owner=user, model="gpt-4", messages=turns(2))
        fact_add(user=user, conversation=conversation, key="city", value="Zürich, Schweiz")
        messages = without_block(conversation)

        conversation_update(conversation=conversation, model="gpt-4o")

        assert state(conversation)[1] == block(conversation)
        assert without_block(conversation) == messages

    def test_subject_writes_lock_the_owner_first_and_conversation_writes_do_not(self, user):
        conversation = conversation_create(owner=user, subject=SUBJECT)
        user_table = user._meta.db_table

        def locked_the_owner(write) -> bool:
            with CaptureQueriesContext(connection) as queries:
                write()
            selects = [q["sql"] for q in queries.captured_queries if "SELECT" in q["sql"]]
            return f'FROM "{user_table}"' in selects[0]

        assert locked_the_owner(lambda: fact_add(user=user, subject=SUBJECT, key="a", value="1"))
        assert locked_the_owner(lambda: conversation_update(conversation=conversation, subject=""))
        assert not locked_the_owner(
            lambda: fact_add(user=user, conversation=conversation, key="b", value="2")
        )
        assert not locked_the_owner(
            lambda: conversation_update(conversation=conversation, title="t")
        )


@pytest.mark.parametrize(
    "subject",
    ["", "customer-42", "Ñandú", "a b", "...", "%", "s" * 200, "a?b#c", "x\u200by"],
)
def test_subjects_that_may_be(subject):
    assert subject_problem(subject) is None


@pytest.mark.parametrize(
    "subject",
    [".", "..", " a", "a ", "a/b", "a\tb", "a\nb", "a\x00b", "a\x7fb", "a\x85b", "s" * 201, 5],
)
def test_subjects_that_may_not_be(subject):
    assert subject_problem(subject)


# --------------------------------------------------------------------------- PostgreSQL


@pytest.mark.parametrize("first", ["fact", "subject"])
@POSTGRES[0]
@POSTGRES[1]
@POSTGRES[2]
def test_a_subject_fact_and_a_conversation_naming_the_subject_meanwhile(user, first):
    """Whichever commits first, the conversation's block ends up counting the fact: the
    second waits for the owner's lock the first holds, then sees what it committed."""
    conversation = conversation_create(owner=user, messages=turns(2))
    messages = without_block(conversation)

    def add() -> Fact:
        return fact_add(user=user, subject=SUBJECT, key="name", value="Maria")

    def name() -> Conversation:
        return conversation_update(
            conversation=Conversation.objects.get(pk=conversation.pk), subject=SUBJECT
        )

    holder, waiter = (add, name) if first == "fact" else (name, add)
    with transaction.atomic():
        holder()
        worker = start(waiter)
        assert wait_until(lambda: blocked(worker.pid)), "the second write did not wait"
    worker.outcome()

    assert state(conversation)[1] == block(conversation) > 0
    assert without_block(conversation) == messages
