"""Key facts over REST: a conversation's (``…/conversations/{id}/facts/``) and a subject's
(``…/subjects/{subject}/facts/``). A person's write moves the facts block of every
conversation that shows the fact, exactly; another user's facts are never seen; bad input
and bad paths answer JSON errors and store nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from ctxsum.facts.block import block_tokens, facts_chosen, facts_recount, facts_visible
from ctxsum.facts.lines import fact_tokens
from ctxsum.facts.models import Fact
from ctxsum.models import Conversation
from ctxsum.services import conversation_create
from ctxsum.summarizers.facts import MAX_KEY_CHARS, MAX_VALUE_CHARS
from tests import query_budgets as budget
from tests.factories import compacted_conversation, turns
from tests.support.errors import field_codes, field_errors
from tests.support.urls import api_url
from tests.test_schema import answer_schema, assert_valid

pytestmark = pytest.mark.django_db

SUBJECT = "customer-42"
NO_SUCH_FACT = {"detail": "No such fact.", "code": "not_found"}
NO_SUCH_CONVERSATION = {"detail": "No such conversation.", "code": "not_found"}


# --------------------------------------------------------------------------- helpers


def expected_block(conversation: Conversation) -> int:
    """The tokens of the conversation's facts block, as the block itself counts them."""
    row = Conversation.objects.get(pk=conversation.pk)
    model = row.model or None
    return block_tokens(facts_chosen(facts_visible(row), model=model), model=model)


def counters(conversation: Conversation) -> tuple[int, int, int]:
    row = Conversation.objects.get(pk=conversation.pk)
    return row.active_tokens, row.facts_tokens, row.revision


def facts_url(conversation: Any, fact: Any = None) -> str:
    if fact is None:
        return api_url("fact-list", conversation)
    return api_url("fact-detail", conversation, fact_id=getattr(fact, "pk", fact))


def subject_url(subject: str = SUBJECT, fact: Any = None) -> str:
    """The subject's URL as a client writes it: the subject percent-encoded."""
    if fact is None:
        return reverse("ctxsum:subject-fact-list", kwargs={"subject": subject})
    return reverse(
        "ctxsum:subject-fact-detail",
        kwargs={"subject": subject, "fact_id": getattr(fact, "pk", fact)},
    )


def raw_subject_url(segment: str, rest: str = "") -> str:
    """A subject URL with ``segment`` exactly as sent (already encoded, or not)."""
    return f"{reverse('ctxsum:api-root')}subjects/{segment}/facts/{rest}"


def post(client: Any, url: str, body: Any, **extra: Any) -> Any:
    return client.post(url, body, format="json", **extra)


def patch(client: Any, url: str, body: Any) -> Any:
    return client.patch(url, body, format="json")


def model_fact(conversation: Conversation | None = None, **fields: Any) -> Fact:
    """A fact as the summarizer's merge writes one, the block recounted after it."""
    owner = conversation.owner if conversation is not None else fields.pop("owner")
    values = {
        "key": "airline",
        "value": "Northwind",
        "changed_by": Fact.ChangedBy.MODEL,
        "confirmed_at": timezone.now(),
        **fields,
    }
    values["token_count"] = fact_tokens(values["key"], values["value"])
    fact = Fact.objects.create(owner=owner, conversation=conversation, **values)
    if conversation is not None:
        facts_recount([Conversation.objects.select_for_update().get(pk=conversation.pk)])
    else:
        shown = Conversation.objects.filter(owner=owner, subject=values["subject"])
        facts_recount(list(shown.select_for_update().order_by("pk")))
    return fact


@pytest.fixture
def chats(user) -> list[Conversation]:
    """Two of alice's conversations naming the subject, and a third naming none."""
    return [
        conversation_create(owner=user, title="first", subject=SUBJECT, messages=turns(2)),
        conversation_create(owner=user, title="second", subject=SUBJECT, messages=turns(4)),
        conversation_create(owner=user, title="third", messages=turns(2)),
    ]


@pytest.fixture
def mallorys(other_user) -> Conversation:
    """Mallory's conversation naming the same subject, with a fact of that subject."""
    conversation = conversation_create(owner=other_user, subject=SUBJECT, messages=turns(2))
    model_fact(owner=other_user, subject=SUBJECT, key="secret", value="mallory's only")
    return conversation


# --------------------------------------------------------------------------- happy paths


def test_a_conversation_fact_is_added_listed_and_counted(api, user, chats):
    conversation = chats[2]
    active, facts_tokens, revision = counters(conversation)
    assert facts_tokens == 0

    response = post(api, facts_url(conversation), {"key": " booking ", "value": " NW7Q2K "})

    assert response.status_code == 201, response.json()
    body = response.json()
    fact = Fact.objects.get()
    assert body == {
        "id": fact.pk,
        "key": "booking",
        "value": "NW7Q2K",
        "scope": "conversation",
        "conversation": str(conversation.pk),
        "subject": "",
        "pinned": False,
        "changed_by": "person",
        "source_conversation": None,
        "source_seqs": [],
        "summary_version": None,
        "proposed_value": "",
        "token_count": fact_tokens("booking", "NW7Q2K"),
        "in_context": True,
        "confirmed_at": body["confirmed_at"],
        "created_at": body["created_at"],
        "updated_at": body["updated_at"],
    }
    assert (fact.changed_by_user, fact.summary, fact.owner) == (user, None, user)
    block = expected_block(conversation)
    assert block > 0
    assert counters(conversation) == (active + block, block, revision + 1)
    listed = api.get(facts_url(conversation)).json()
    assert listed["count"] == 1 and listed["results"] == [body]
    assert api.get(facts_url(conversation, fact)).json() == body


def test_a_subject_fact_reaches_every_conversation_of_the_subject(api, chats, mallorys):
    before = {c.pk: counters(c) for c in (*chats, mallorys)}

    response = post(api, subject_url(), {"key": "name", "value": "Maria", "pinned": True})

    assert response.status_code == 201, response.json()
    created = response.json()
    assert (created["scope"], created["subject"], created["conversation"]) == (
        "subject",
        SUBJECT,
        None,
    )
    assert created["pinned"] and created["in_context"] is None  # depends on the conversation
    for conversation in chats[:2]:
        listed = api.get(facts_url(conversation)).json()["results"]
        assert [(f["id"], f["in_context"]) for f in listed] == [(created["id"], True)]
        active, facts_tokens, revision = counters(conversation)
        old_active, old_facts, old_revision = before[conversation.pk]
        block = expected_block(conversation)
        assert facts_tokens == block > 0
        assert active - old_active == block - old_facts
        assert revision == old_revision + 1
    # Neither the conversation without the subject nor mallory's with it moved.
    assert counters(chats[2]) == before[chats[2].pk]
    assert counters(mallorys) == before[mallorys.pk]
    assert api.get(facts_url(chats[2])).json()["results"] == []
    listed = api.get(subject_url()).json()
    assert [fact["key"] for fact in listed["results"]] == ["name"]
    assert api.get(subject_url(fact=created["id"])).json() == created


def test_a_subject_fact_may_come_before_any_conversation_names_it(api, user):
    created = post(api, subject_url("later"), {"key": "tier", "value": "gold"})
    assert created.status_code == 201

    response = post(
        api, reverse("ctxsum:conversation-list"), {"subject": "later", "messages": turns(2)}
    )

    assert response.status_code == 201, response.json()
    conversation = Conversation.objects.get(pk=response.json()["id"])
    assert response.json()["subject"] == "later"
    assert response.json()["facts_tokens"] == expected_block(conversation) > 0
    assert conversation.active_tokens == sum(
        conversation.messages.values_list("token_count", flat=True)
    ) + expected_block(conversation)
    listed = api.get(facts_url(conversation)).json()["results"]
    assert [(fact["key"], fact["scope"], fact["in_context"]) for fact in listed] == [
        ("tier", "subject", True)
    ]


def test_changing_a_conversations_subject_recounts_its_block(api, chats):
    post(api, subject_url("other-subject"), {"key": "city", "value": "Lisbon, Portugal"})
    conversation = chats[2]
    active, _, revision = counters(conversation)

    named = patch(api, api_url("conversation-detail", conversation), {"subject": "other-subject"})

    assert named.status_code == 200, named.json()
    block = expected_block(conversation)
    assert (named.json()["subject"], named.json()["facts_tokens"]) == ("other-subject", block)
    assert counters(conversation) == (active + block, block, revision + 1)  # moved once
    moved = patch(api, api_url("conversation-detail", conversation), {"subject": SUBJECT})
    assert moved.status_code == 200
    assert counters(conversation) == (active, 0, revision + 2)  # SUBJECT has no facts
    cleared = patch(api, api_url("conversation-detail", conversation), {"subject": ""})
    assert cleared.json()["subject"] == "" and counters(conversation) == (active, 0, revision + 3)


def test_patch_changes_value_key_and_pin_and_settles_a_proposal(api, user, offline_summarizer):
    conversation = compacted_conversation(
        user, messages=turns(8, "turn {i}: the flight is NW 486"), keep={"messages": 2}
    )
    summary = conversation.summaries.get()
    fact = model_fact(
        conversation,
        key="flight",
        value="NW 486",
        summary=summary,
        source_conversation=conversation,
        source_seqs=[1, 3],
        proposed_value="NW 488",
        proposed_by=summary,
    )
    shown = api.get(facts_url(conversation, fact)).json()
    assert (shown["summary_version"], shown["proposed_value"], shown["changed_by"]) == (
        1,
        "NW 488",
        "model",
    )
    assert (shown["source_conversation"], shown["source_seqs"]) == (str(conversation.pk), [1, 3])

    # Pinning keeps the version that wrote the value, and the proposal waits.
    pinned = patch(api, facts_url(conversation, fact), {"pinned": True}).json()
    assert (pinned["pinned"], pinned["changed_by"], pinned["summary_version"]) == (
        True,
        "person",
        1,
    )
    assert pinned["proposed_value"] == "NW 488"
    # Accepting the proposal: the value is the person's now, the proposal settled.
    active, facts_tokens, revision = counters(conversation)
    outside = active - facts_tokens  # the context without its facts block
    accepted = patch(api, facts_url(conversation, fact), {"value": "NW 488"}).json()
    assert (accepted["value"], accepted["proposed_value"], accepted["summary_version"]) == (
        "NW 488",
        "",
        None,
    )
    assert Fact.objects.get(pk=fact.pk).proposed_by is None
    # Same token count, other words: the revision still moves (the block's text changed).
    assert counters(conversation)[2] == revision + 1
    # A key is normalized as the summarizer's are.
    renamed = patch(api, facts_url(conversation, fact), {"key": "Return flight"}).json()
    assert renamed["key"] == "return_flight"
    assert renamed["token_count"] == fact_tokens("return_flight", "NW 488")
    active, facts_tokens, _ = counters(conversation)
    assert facts_tokens == expected_block(conversation)
    assert active == outside + facts_tokens
    assert patch(api, facts_url(conversation, fact), {}).json() == renamed  # nothing to write


def test_a_subject_fact_changed_through_a_conversation_changes_for_all(api, chats):
    created = post(api, subject_url(), {"key": "name", "value": "Maria"}).json()

    response = patch(api, facts_url(chats[0], created["id"]), {"value": "Maria Lopes da Silva"})

    assert response.status_code == 200, response.json()
    for conversation in chats[:2]:
        fact = api.get(facts_url(conversation, created["id"])).json()
        assert fact["value"] == "Maria Lopes da Silva"
        assert counters(conversation)[1] == expected_block(conversation)
    patched = patch(api, subject_url(fact=created["id"]), {"pinned": True})
    assert patched.status_code == 200 and patched.json()["pinned"]


def test_delete_removes_the_fact_and_its_tokens(api, chats):
    conversation = chats[0]
    start = counters(conversation)
    own = post(api, facts_url(conversation), {"key": "seat", "value": "14A"}).json()
    shared = post(api, subject_url(), {"key": "name", "value": "Maria"}).json()

    assert api.delete(facts_url(conversation, own["id"])).status_code == 204
    assert api.delete(subject_url(fact=shared["id"])).status_code == 204

    assert not Fact.objects.exists()
    active, facts_tokens, revision = counters(conversation)
    assert (active, facts_tokens, revision) == (start[0], 0, start[2] + 4)
    assert api.get(facts_url(conversation, own["id"])).json() == NO_SUCH_FACT
    assert api.delete(subject_url(fact=shared["id"])).status_code == 404


def test_the_block_shows_one_fact_per_key_within_its_budget(api, chats, settings):
    conversation = chats[0]
    shared = post(api, subject_url(), {"key": "name", "value": "Maria"}).json()
    own = post(api, facts_url(conversation), {"key": "name", "value": "Maria L."}).json()

    listed = {f["id"]: f["in_context"] for f in api.get(facts_url(conversation)).json()["results"]}
    assert listed == {own["id"]: True, shared["id"]: False}  # the conversation's own wins
    other = {f["id"]: f["in_context"] for f in api.get(facts_url(chats[1])).json()["results"]}
    assert other == {shared["id"]: True}

    settings.CTXSUM = {**settings.CTXSUM, "FACTS_MAX_TOKENS": 0}
    results = api.get(facts_url(conversation)).json()["results"]
    assert [f["in_context"] for f in results] == [False, False]


def test_deleting_a_conversation_takes_its_facts_not_its_subjects(api, chats):
    conversation = chats[0]
    post(api, facts_url(conversation), {"key": "seat", "value": "14A"})
    post(api, subject_url(), {"key": "name", "value": "Maria"})

    assert api.delete(api_url("conversation-detail", conversation)).status_code == 204

    assert list(Fact.objects.values_list("key", flat=True)) == ["name"]
    assert counters(chats[1])[1] == expected_block(chats[1]) > 0


def test_a_post_with_an_idempotency_key_adds_once(api, chats):
    conversation = chats[2]
    key = {"HTTP_IDEMPOTENCY_KEY": "fact-0001"}
    body = {"key": "seat", "value": "14A"}

    first = post(api, facts_url(conversation), body, **key)
    retry = post(api, facts_url(conversation), body, **key)

    assert (first.status_code, retry.status_code) == (201, 201)
    assert retry.json() == first.json() and retry["Idempotent-Replayed"] == "true"
    assert Fact.objects.count() == 1
    other = post(api, facts_url(conversation), {**body, "value": "15C"}, **key)
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"


# --------------------------------------------------------------------------- refusals


def stored(conversations: list[Conversation]) -> tuple:
    """Everything a refused request must leave as it was."""
    return (
        list(Fact.objects.order_by("pk").values()),
        [counters(conversation) for conversation in conversations],
    )


BAD_BODIES = [
    ({"value": "x"}, "key", "This field is required."),
    ({"key": "k"}, "value", "This field is required."),
    ({"key": "", "value": "x"}, "key", "Must not be blank."),
    ({"key": "   ", "value": "x"}, "key", "Must not be blank."),
    ({"key": "k", "value": " \n "}, "value", "Must not be blank."),
    ({"key": "two\nlines", "value": "x"}, "key", "Must be one line (no line breaks)."),
    ({"key": "two\u2028lines", "value": "x"}, "key", "Must be one line (no line breaks)."),
    ({"key": "k" * (MAX_KEY_CHARS + 1), "value": "x"}, "key", "Must be at most 200 characters."),
    (
        {"key": "k", "value": "v" * (MAX_VALUE_CHARS + 1)},
        "value",
        "Must be at most 2000 characters.",
    ),
    ({"key": 5, "value": "x"}, "key", "Must be a string."),
    ({"key": "k", "value": ["x"]}, "value", "Must be a string."),
    ({"key": "k", "value": None}, "value", "This field may not be null."),
    ({"key": "k", "value": "x", "pinned": "yes"}, "pinned", "Must be true or false."),
    ({"key": "k", "value": "x", "pinned": 1}, "pinned", "Must be true or false."),
    ({"key": "k\u0000", "value": "x"}, "key", "Null characters are not allowed."),
    ({"key": "k", "value": "x", "subject": SUBJECT}, "subject", "Unknown field."),
    ({"key": "k", "value": "x", "summary_version": 1}, "summary_version", "Unknown field."),
]

# The code a program reads for the errors that have one of their own.
CODES = {
    "This field is required.": "required",
    "This field may not be null.": "null",
    "Unknown field.": "unknown_field",
}


@pytest.mark.parametrize(("body", "field", "error"), BAD_BODIES)
@pytest.mark.parametrize("where", ["conversation", "subject"])
def test_a_bad_body_is_a_400_naming_the_field_and_stores_nothing(
    api, chats, where, body, field, error
):
    before = stored(chats)
    url = facts_url(chats[0]) if where == "conversation" else subject_url()

    response = post(api, url, body)

    assert response.status_code == 400, response.json()
    assert field_errors(response)[field] == [error]
    if error in CODES:
        assert field_codes(response)[field] == [CODES[error]]
    assert stored(chats) == before


@pytest.mark.parametrize(("body", "field", "error"), BAD_BODIES[2:])
def test_a_bad_patch_is_a_400_naming_the_field_and_changes_nothing(api, chats, body, field, error):
    fact = post(api, facts_url(chats[0]), {"key": "seat", "value": "14A"}).json()
    before = stored(chats)
    body = {name: value for name, value in body.items() if name != "key" or field == "key"}
    body = {name: value for name, value in body.items() if name != "value" or field == "value"}

    response = patch(api, facts_url(chats[0], fact["id"]), body)

    assert response.status_code == 400, response.json()
    assert field_errors(response)[field] == [error]
    if error in CODES:
        assert field_codes(response)[field] == [CODES[error]]
    assert stored(chats) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"key": "\\ud800", "value": "x"}', "key"),
        ('{"key": "k", "value": "a\\udfffb"}', "value"),
        ('{"key": "k", "value": "x", "pinned": null}', "pinned"),
    ],
)
def test_a_raw_body_the_database_cannot_hold_is_a_400(api, chats, body, field):
    before = stored(chats)
    for url in (facts_url(chats[0]), subject_url()):
        response = api.generic("POST", url, body, content_type="application/json")
        assert response.status_code == 400, response.content
        assert list(field_errors(response)) == [field]
    assert stored(chats) == before


def test_a_key_taken_already_is_a_400_naming_key(api, chats):
    post(api, facts_url(chats[0]), {"key": "seat", "value": "14A"})
    post(api, facts_url(chats[0]), {"key": "meal", "value": "vegetarian"})
    post(api, subject_url(), {"key": "name", "value": "Maria"})
    before = stored(chats)

    again = post(api, facts_url(chats[0]), {"key": " seat", "value": "15C"})
    shared = post(api, subject_url(), {"key": "name", "value": "Ana"})
    meal = Fact.objects.get(key="meal")
    renamed = patch(api, facts_url(chats[0], meal.pk), {"key": "seat", "value": "aisle"})

    assert field_errors(again) == {
        "key": ["This conversation already has a fact with the key 'seat'."]
    }
    assert field_errors(shared) == {
        "key": [f"The subject '{SUBJECT}' already has a fact with the key 'name'."]
    }
    assert renamed.status_code == 400 and list(field_errors(renamed)) == ["key"]
    assert stored(chats) == before
    # The same key in another conversation, or for the conversation beside its subject's: fine.
    assert post(api, facts_url(chats[1]), {"key": "seat", "value": "2B"}).status_code == 201
    assert post(api, facts_url(chats[0]), {"key": "name", "value": "M."}).status_code == 201


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        (" padded", "Must not start or end with whitespace."),
        ("a/b", "Must not contain a slash or a control character."),
        ("tab\there", "Must not contain a slash or a control character."),
        ("..", "Must not be “.” or “..”."),
        ("s" * 201, "Must be at most 200 characters."),
        (5, "Must be a string."),
    ],
)
def test_a_conversation_subject_no_subject_can_have_is_a_400(api, chats, subject, problem):
    before = counters(chats[0])

    created = post(api, reverse("ctxsum:conversation-list"), {"subject": subject})
    changed = patch(api, api_url("conversation-detail", chats[0]), {"subject": subject})

    for response in (created, changed):
        assert response.status_code == 400, response.json()
        assert field_errors(response) == {"subject": [problem]}
    assert Conversation.objects.count() == len(chats)
    assert counters(chats[0]) == before


# --------------------------------------------------------------------------- isolation


def test_someone_elses_conversation_facts_are_404(api, other_api, chats, mallorys):
    fact = post(api, facts_url(chats[0]), {"key": "seat", "value": "14A"}).json()
    before = stored(chats)

    answers = [
        other_api.get(facts_url(chats[0])),
        post(other_api, facts_url(chats[0]), {"key": "x", "value": "y"}),
        other_api.get(facts_url(chats[0], fact["id"])),
        patch(other_api, facts_url(chats[0], fact["id"]), {"value": "pwned"}),
        other_api.delete(facts_url(chats[0], fact["id"])),
    ]

    for response in answers:
        assert (response.status_code, response.json()) == (404, NO_SUCH_CONVERSATION)
    assert stored(chats) == before


def test_someone_elses_subject_facts_are_never_seen(api, other_api, chats, mallorys):
    theirs = Fact.objects.get(owner=mallorys.owner)
    mine = post(api, subject_url(), {"key": "name", "value": "Maria"}).json()
    before = stored(chats)

    assert [f["key"] for f in api.get(subject_url()).json()["results"]] == ["name"]
    assert [f["key"] for f in other_api.get(subject_url()).json()["results"]] == ["secret"]
    for conversation in chats[:2]:
        listed = api.get(facts_url(conversation)).json()["results"]
        assert [f["id"] for f in listed] == [mine["id"]]
    for response in (
        api.get(subject_url(fact=theirs)),
        patch(api, subject_url(fact=theirs), {"value": "pwned"}),
        api.delete(subject_url(fact=theirs)),
        api.get(facts_url(chats[0], theirs)),
        patch(api, facts_url(chats[0], theirs), {"pinned": True}),
        api.delete(facts_url(chats[0], theirs)),
        other_api.get(subject_url(fact=mine["id"])),
        other_api.delete(subject_url(fact=mine["id"])),
        other_api.get(facts_url(mallorys, mine["id"])),
    ):
        assert (response.status_code, response.json()) == (404, NO_SUCH_FACT)
    assert stored(chats) == before
    assert Fact.objects.get(pk=theirs.pk).value == "mallory's only"


def test_a_fact_of_another_conversation_is_404_on_this_one(api, chats):
    own = post(api, facts_url(chats[0]), {"key": "seat", "value": "14A"}).json()
    shared = post(api, subject_url(), {"key": "name", "value": "Maria"}).json()

    assert api.get(facts_url(chats[1], own["id"])).json() == NO_SUCH_FACT
    assert api.delete(facts_url(chats[2], own["id"])).status_code == 404
    assert api.get(facts_url(chats[1], shared["id"])).status_code == 200  # it sees the subject
    assert api.get(facts_url(chats[2], shared["id"])).json() == NO_SUCH_FACT
    assert api.get(subject_url(fact=own["id"])).json() == NO_SUCH_FACT
    assert api.get(subject_url("another", fact=shared["id"])).json() == NO_SUCH_FACT
    assert Fact.objects.count() == 2


@pytest.mark.parametrize(
    "fact_id",
    ["0", "-1", "01", "+1", "1.0", "1e3", "abc", "%20", "%D9%A1", "9" * 19, "9" * 30, "1%00"],
)
def test_a_fact_id_no_fact_has_is_404_json(api, chats, fact_id):
    post(api, facts_url(chats[0]), {"key": "seat", "value": "14A"})
    before = stored(chats)
    conversation_path = facts_url(chats[0]) + f"{fact_id}/"
    subject_path = subject_url() + f"{fact_id}/"

    for path in (conversation_path, subject_path):
        for response in (
            api.get(path),
            patch(api, path, {"value": "x"}),
            api.delete(path),
        ):
            assert response.status_code == 404, (path, response.content)
            assert response.json() == NO_SUCH_FACT
    assert stored(chats) == before


ODD_SUBJECTS = [
    pytest.param("s" * 201, id="201-chars"),
    pytest.param("s" * 5000, id="5000-chars"),
    pytest.param("..", id="dot-dot"),
    pytest.param("%2E%2E", id="dot-dot-encoded"),
    pytest.param(".", id="dot"),
    pytest.param("%00", id="nul"),
    pytest.param("a%00b", id="nul-inside"),
    pytest.param("%09tab", id="tab"),
    pytest.param("%20padded", id="leading-space"),
    pytest.param("padded%20", id="trailing-space"),
    pytest.param("%0A", id="newline"),
    pytest.param("a%7Fb", id="del"),
    pytest.param("%C2%85", id="next-line"),
]


@pytest.mark.parametrize("segment", ODD_SUBJECTS)
def test_a_subject_no_subject_can_have_is_404_json(api, chats, segment):
    before = stored(chats)

    for response in (
        api.get(raw_subject_url(segment)),
        post(api, raw_subject_url(segment), {"key": "k", "value": "v"}),
        api.get(raw_subject_url(segment, "1/")),
        patch(api, raw_subject_url(segment, "1/"), {"value": "x"}),
        api.delete(raw_subject_url(segment, "1/")),
    ):
        assert response.status_code == 404, (segment, response.status_code)
        assert response["Content-Type"] == "application/json"
        assert response.json()["code"] == "not_found"
        assert response.json()["detail"].startswith("No subject has this name")
    assert stored(chats) == before


@pytest.mark.parametrize(
    ("segment", "subject"),
    [
        pytest.param("%C3%91and%C3%BA%20%E2%80%94%20caf%C3%A9", "Ñandú — café", id="unicode"),
        pytest.param("%F0%9F%A6%9C", "\N{PARROT}", id="emoji"),
        pytest.param("%25", "%", id="percent"),
        pytest.param("%FF", "%FF", id="not-utf8"),  # Django keeps broken bytes percent-encoded
        pytest.param("a%3Fb%23c", "a?b#c", id="query-and-fragment"),
        pytest.param("s" * 200, "s" * 200, id="200-chars"),
        pytest.param("...", "...", id="three-dots"),
    ],
)
def test_an_unusual_but_valid_subject_works(api, user, segment, subject):
    listed = api.get(raw_subject_url(segment))
    assert (listed.status_code, listed.json()["results"]) == (200, [])

    created = post(api, raw_subject_url(segment), {"key": "k", "value": "v"})

    assert created.status_code == 201, created.content
    assert created.json()["subject"] == subject
    assert Fact.objects.get().subject == subject
    listed = api.get(raw_subject_url(segment)).json()["results"]
    assert [fact["subject"] for fact in listed] == [subject]
    conversation = conversation_create(owner=user, subject=subject, messages=turns(2))
    assert api.get(facts_url(conversation)).json()["results"][0]["in_context"] is True


def test_a_slash_cannot_reach_a_subject(api, chats):
    # %2F is decoded before routing: the path has one segment more and names nothing.
    response = api.get(raw_subject_url("a%2Fb"))
    assert response.status_code == 404 and response.json()["code"] == "not_found"


# --------------------------------------------------------------------------- the API's frame


FACT_ENDPOINTS = [
    ("fact-list", {"GET", "POST"}),
    ("fact-detail", {"GET", "PATCH", "DELETE"}),
    ("subject-fact-list", {"GET", "POST"}),
    ("subject-fact-detail", {"GET", "PATCH", "DELETE"}),
]


def endpoint_url(name: str, conversation: Conversation, fact: dict[str, Any]) -> str:
    kwargs: dict[str, Any] = {}
    if name.startswith("subject"):
        kwargs["subject"] = SUBJECT
    else:
        kwargs["pk"] = conversation.pk
    if name.endswith("detail"):
        kwargs["fact_id"] = fact["id"]
    return reverse(f"ctxsum:{name}", kwargs=kwargs)


@pytest.mark.parametrize(("name", "methods"), FACT_ENDPOINTS)
def test_options_and_the_browsable_api_work(api, chats, name, methods):
    fact = post(api, subject_url(), {"key": "name", "value": "Maria"}).json()
    address = endpoint_url(name, chats[0], fact)

    options = api.options(address)
    assert options.status_code == 200 and options["Content-Type"] == "application/json"
    assert methods <= {method.strip() for method in options["Allow"].split(",")}
    if "POST" in methods:
        assert set(options.json()["actions"]["POST"]) == {"key", "value", "pinned"}
    html = api.get(address, HTTP_ACCEPT="text/html")
    assert html.status_code == 200 and html["Content-Type"].startswith("text/html")
    assert b"Django REST framework" in html.content


def test_no_credentials_is_401(chats):
    from rest_framework.test import APIClient

    client = APIClient()
    for address in (facts_url(chats[0]), subject_url()):
        response = client.get(address)
        assert response.status_code in (401, 403)
        assert response.json()["code"] == "not_authenticated"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def test_every_answer_is_as_the_schema_describes_it(api, chats, document):
    conversation = chats[0]
    own_path = "/api/conversations/{id}/facts/"
    subject_path = "/api/subjects/{subject}/facts/"
    created = post(api, facts_url(conversation), {"key": "seat", "value": "14A"})
    assert_valid(answer_schema(document, own_path, "post", 201), created.json())
    shared = post(api, subject_url(), {"key": "name", "value": "Maria", "pinned": True})
    assert_valid(answer_schema(document, subject_path, "post", 201), shared.json())
    for path, address in (
        (own_path, facts_url(conversation)),
        (subject_path, subject_url()),
    ):
        assert_valid(answer_schema(document, path, "get", 200), api.get(address).json())
    detail = own_path + "{fact_id}/"
    one = facts_url(conversation, created.json()["id"])
    assert_valid(answer_schema(document, detail, "get", 200), api.get(one).json())
    assert_valid(answer_schema(document, detail, "patch", 200), patch(api, one, {}).json())
    subject_detail = subject_path + "{fact_id}/"
    theirs = subject_url(fact=shared.json()["id"])
    assert_valid(answer_schema(document, subject_detail, "get", 200), api.get(theirs).json())
    changed = patch(api, theirs, {"value": "Maria L."}).json()
    assert_valid(answer_schema(document, subject_detail, "patch", 200), changed)
    detail_answer = api.get(api_url("conversation-detail", conversation)).json()
    assert_valid(answer_schema(document, "/api/conversations/{id}/", "get", 200), detail_answer)
    operation = document["paths"][own_path]["post"]
    assert any(p["name"] == "Idempotency-Key" for p in operation["parameters"])


# --------------------------------------------------------------------------- queries


def test_the_list_reads_a_page_of_facts_not_every_one(api, chats):
    conversation = chats[0]
    for index in range(60):
        model_fact(conversation, key=f"own {index:02d}", value=f"value {index}")

    sqls: list[str] = []

    def record(execute: Any, sql: str, *args: Any) -> Any:
        sqls.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(record):
        first = api.get(facts_url(conversation)).json()
    second = api.get(facts_url(conversation) + "?page=2").json()

    reads = [sql for sql in sqls if 'FROM "ctxsum_fact"' in sql]
    assert len(reads) == 3 and all("LIMIT" in sql or "COUNT(" in sql for sql in reads)
    assert (first["count"], len(first["results"]), len(second["results"])) == (60, 50, 10)
    keys = [fact["key"] for fact in first["results"] + second["results"]]
    assert keys == [f"own {index:02d}" for index in reversed(range(60))]


@pytest.mark.parametrize("count", [2, 40])
def test_the_lists_take_the_same_queries_however_many_facts(
    api, user, chats, count, assert_queries_at_most
):
    conversation = chats[0]
    for index in range(count):
        model_fact(conversation, key=f"own {index}", value=f"value {index}")
        model_fact(owner=user, subject=SUBJECT, key=f"shared {index}", value=f"value {index}")

    with assert_queries_at_most(budget.CONVERSATION_FACTS):
        listed = api.get(facts_url(conversation))
    with assert_queries_at_most(budget.SUBJECT_FACTS):
        shared = api.get(subject_url())
    one = facts_url(conversation, Fact.objects.first())
    with assert_queries_at_most(budget.CONVERSATION_FACTS):
        api.get(one)

    assert listed.json()["count"] == 2 * count and shared.json()["count"] == count
