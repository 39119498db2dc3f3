"""Key facts in the admin: on a conversation's review page (its own and its subject's, with
what the facts block shows), on a summary's page (what that version wrote), and in their own
list. Each fact's source messages are one click away; values are escaped; staff may pin,
unpin and delete, through the services, and nothing else; non-staff reach nothing."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ctxsum.facts.block import block_tokens, facts_chosen, facts_recount, facts_visible
from ctxsum.facts.lines import fact_tokens
from ctxsum.facts.models import Fact, FactChange
from ctxsum.facts.services import fact_add
from ctxsum.models import Conversation, Summary
from ctxsum.services import conversation_create
from tests import query_budgets as budget
from tests.factories import compacted_conversation, turns

pytestmark = pytest.mark.django_db

SUBJECT = "customer-42"
SCRIPT = "<script>alert('fact')</script>"


def url(name: str, *args) -> str:
    app = "ctxsum_facts" if name.startswith("fact_") else "ctxsum"
    return reverse(f"admin:{app}_{name}", args=args)


def page(client: Client, address: str, status: int = 200) -> str:
    response = client.get(address)
    assert response.status_code == status, response.content[:2000]
    return response.content.decode()


def block(conversation: Conversation) -> int:
    row = Conversation.objects.get(pk=conversation.pk)
    model = row.model or None
    return block_tokens(facts_chosen(facts_visible(row), model=model), model=model)


class Links(HTMLParser):
    """Every href of a page, and the text of its <script> elements."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def links(html: str) -> Links:
    parser = Links()
    parser.feed(html)
    return parser


@pytest.fixture
def summarized(user, offline_summarizer) -> Conversation:
    """A conversation naming the subject, compacted once, with the facts its summary
    wrote (as the merge writes them: a FactChange each), one of its own a person added,
    and one of its subject with hostile text."""
    conversation = compacted_conversation(
        user,
        subject=SUBJECT,
        messages=turns(8, "turn {i}: booking NW7Q2K, seat {i}A"),
        keep={"messages": 2},
    )
    # Only the facts below: not the ones the offline summarizer extracted as it compacted.
    Fact.objects.filter(owner=user).delete()
    summary = Summary.objects.get(conversation=conversation)
    now = timezone.now()
    written = Fact.objects.create(
        owner=user,
        conversation=conversation,
        key="booking",
        value="NW7Q2K",
        summary=summary,
        source_conversation=conversation,
        source_seqs=[1, 3],
        proposed_value=f"NW7Q2L {SCRIPT}",
        proposed_by=summary,
        token_count=fact_tokens("booking", "NW7Q2K"),
        confirmed_at=now,
    )
    FactChange.objects.create(fact=written, summary=summary, kind=FactChange.Kind.CREATED)
    shared = Fact.objects.create(
        owner=user,
        subject=SUBJECT,
        key=f"note {SCRIPT}",
        value=f"prefers {SCRIPT} aisle seats",
        summary=summary,
        source_conversation=conversation,
        source_seqs=[5],
        token_count=fact_tokens("note", "prefers aisle seats"),
        confirmed_at=now,
    )
    FactChange.objects.create(
        fact=shared, summary=summary, kind=FactChange.Kind.UPDATED, old_value="prefers window seats"
    )
    facts_recount([conversation])
    fact_add(user=user, conversation=conversation, key="seat", value="14A", pinned=True)
    conversation.refresh_from_db()
    return conversation


def test_the_review_page_lists_the_facts_with_their_sources(admin_client, summarized):
    html = page(admin_client, url("conversation_review", summarized.pk))

    assert 'id="facts"' in html and "Key facts" in html
    for key in ("booking", "seat"):
        assert f">{key}</a>" in html
    assert f"the facts block: {summarized.facts_tokens} tokens" in html
    assert summarized.facts_tokens == block(summarized) > 0
    assert "pinned" in html and "in the context" in html and "proposed" in html
    review = url("conversation_review", summarized.pk)
    sources = [href for href in links(html).hrefs if href.startswith(review + "?page=")]
    assert sorted(sources) == sorted(f"{review}?page=1#m{seq}" for seq in (1, 3, 5))
    for href in sources:
        target = page(admin_client, href)
        assert f'id="{urlsplit(href).fragment}"' in target  # the message is on that page
    for fact in Fact.objects.all():
        assert url("fact_change", fact.pk) in html
        page(admin_client, url("fact_change", fact.pk))


def test_fact_text_is_escaped_everywhere(admin_client, summarized):
    summary = Summary.objects.get(conversation=summarized)
    shared = Fact.objects.get(subject=SUBJECT)
    for address in (
        url("conversation_review", summarized.pk),
        url("summary_change", summary.pk),
        url("fact_changelist"),
        url("fact_changelist") + "?q=aisle",
        url("fact_change", shared.pk),
        url("fact_change", Fact.objects.get(key="booking").pk),
    ):
        html = page(admin_client, address)
        assert SCRIPT not in html, address
        assert "&lt;script&gt;" in html, address
        assert not any("alert('fact')" in script for script in links(html).scripts), address


def test_the_summary_page_lists_the_facts_that_version_wrote(admin_client, summarized):
    summary = Summary.objects.get(conversation=summarized)

    html = page(admin_client, url("summary_change", summary.pk))

    assert "Key facts this version wrote" in html
    assert ">booking</a>" in html and "prefers window seats" in html  # the value before
    assert ">seat</a>" not in html  # a person's, not this version's
    assert ">new<" in html  # booking was created by it
    summary.facts_skipped = "the answer had no facts section"
    summary.save()
    html = page(admin_client, url("summary_change", summary.pk))
    assert "the answer had no facts section" in html


def test_the_fact_list_searches_and_filters(admin_client, summarized, other_user):
    conversation_create(owner=other_user, subject=SUBJECT)
    fact_add(user=other_user, subject=SUBJECT, key="theirs", value="mallory")
    listing = url("fact_changelist")

    def keys(query: str) -> set[str]:
        html = page(admin_client, listing + query)
        return {fact.key for fact in Fact.objects.all() if url("fact_change", fact.pk) in html}

    everything = {fact.key for fact in Fact.objects.all()}
    assert keys("") == everything
    assert keys("?q=NW7Q2K") == {"booking"}
    assert keys("?q=aisle") == {f"note {SCRIPT}"}
    assert keys("?pinned__exact=1") == {"seat"}
    assert keys("?changed_by__exact=person") == {"seat", "theirs"}
    assert keys("?changed_by__exact=model") == {"booking", f"note {SCRIPT}"}
    assert keys("?scope=subject") == {f"note {SCRIPT}", "theirs"}
    assert keys("?scope=conversation") == {"booking", "seat"}
    assert keys(f"?conversation={summarized.pk}") == {"booking", "seat"}
    owner = summarized.owner_id
    assert keys(f"?subject={SUBJECT}&owner={owner}") == {f"note {SCRIPT}"}
    # The review page's links to these lists.
    html = page(admin_client, url("conversation_review", summarized.pk))
    assert f"{listing}?conversation={summarized.pk}" in html
    assert f"{listing}?subject={SUBJECT}&amp;owner={owner}" in html


def test_every_column_sorts(admin_client, summarized):
    from django.contrib import admin

    model_admin = admin.site.get_model_admin(Fact)
    for order in range(1, len(model_admin.list_display) + 1):
        for sign in ("", "-"):
            page(admin_client, url("fact_changelist") + f"?o={sign}{order}")


def act(client: Client, action: str, facts, **extra) -> list[str]:
    response = client.post(
        url("fact_changelist"),
        {"action": action, "_selected_action": [str(fact.pk) for fact in facts], **extra},
        follow=True,
    )
    assert response.status_code == 200
    return [str(message) for message in response.context["messages"]]


def test_pin_and_unpin_go_through_the_service(admin_client, summarized, admin_user):
    booking = Fact.objects.get(key="booking")
    seat = Fact.objects.get(key="seat")
    revision = summarized.revision

    assert act(admin_client, "pin", [booking, seat]) == ["1 fact pinned."]

    booking.refresh_from_db()
    assert (booking.pinned, booking.changed_by, booking.changed_by_user) == (
        True,
        "person",
        admin_user,
    )
    assert booking.summary is not None  # pinning keeps the version that wrote the value
    summarized.refresh_from_db()
    assert summarized.revision == revision + 1 and summarized.facts_tokens == block(summarized)
    assert act(admin_client, "unpin", [booking, seat]) == ["2 facts unpinned."]
    assert not Fact.objects.filter(pinned=True).exists()
    history = page(admin_client, url("fact_history", booking.pk))
    assert "Pinned." in history and "Unpinned." in history


def test_delete_goes_through_the_service(admin_client, summarized):
    seat = Fact.objects.get(key="seat")
    shared = Fact.objects.get(subject=SUBJECT)
    active = summarized.active_tokens - summarized.facts_tokens

    response = admin_client.post(url("fact_delete", seat.pk), {"post": "yes"})
    assert response.status_code == 302
    confirm = admin_client.post(
        url("fact_changelist"), {"action": "delete_selected", "_selected_action": [shared.pk]}
    )
    assert confirm.status_code == 200 and b"Are you sure" in confirm.content
    act(admin_client, "delete_selected", [shared], post="yes")

    assert list(Fact.objects.values_list("key", flat=True)) == ["booking"]
    summarized.refresh_from_db()
    assert summarized.facts_tokens == block(summarized) > 0
    assert summarized.active_tokens == active + summarized.facts_tokens


def test_a_fact_is_never_added_or_edited_in_the_admin(admin_client, summarized):
    fact = Fact.objects.get(key="seat")
    assert admin_client.get(url("fact_add")).status_code == 403
    change = page(admin_client, url("fact_change", fact.pk))
    assert 'name="value"' not in change and 'name="key"' not in change
    response = admin_client.post(url("fact_change", fact.pk), {"value": "pwned"})
    assert response.status_code == 403
    assert Fact.objects.get(pk=fact.pk).value == "14A"


def staff_with(django_user_model, *codenames: str) -> Client:
    staff = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(staff)
    return client


def test_view_permission_shows_without_pinning_or_deleting(django_user_model, summarized):
    client = staff_with(django_user_model, "view_fact", "view_conversation")
    fact = Fact.objects.get(key="booking")

    changelist = page(client, url("fact_changelist"))

    assert 'value="pin"' not in changelist and 'value="delete_selected"' not in changelist
    act(client, "pin", [fact])
    assert not Fact.objects.get(pk=fact.pk).pinned
    assert client.post(url("fact_delete", fact.pk), {"post": "yes"}).status_code == 403
    assert Fact.objects.filter(pk=fact.pk).exists()
    assert url("fact_change", fact.pk) in page(client, url("conversation_review", summarized.pk))


def test_change_permission_pins_and_delete_permission_deletes(django_user_model, summarized):
    client = staff_with(django_user_model, "view_fact", "change_fact", "delete_fact")
    changelist = page(client, url("fact_changelist"))
    assert 'value="pin"' in changelist and 'value="delete_selected"' in changelist
    fact = Fact.objects.get(key="booking")
    act(client, "pin", [fact])
    assert Fact.objects.get(pk=fact.pk).pinned


def test_without_view_permission_facts_are_not_linked(django_user_model, summarized):
    client = staff_with(django_user_model, "view_conversation")
    html = page(client, url("conversation_review", summarized.pk))
    assert "booking" in html and url("fact_changelist") not in html
    assert client.get(url("fact_changelist")).status_code == 403


def test_a_non_staff_user_reaches_no_fact_page(client, user, summarized):
    client.force_login(user)
    fact = Fact.objects.get(key="booking")
    for address in (
        url("fact_changelist"),
        url("fact_change", fact.pk),
        url("fact_delete", fact.pk),
    ):
        response = client.get(address)
        assert response.status_code == 302, address
        assert response["Location"].startswith(reverse("admin:login"))
    client.post(url("fact_delete", fact.pk), {"post": "yes"})
    client.post(url("fact_changelist"), {"action": "pin", "_selected_action": [fact.pk]})
    assert Fact.objects.filter(pk=fact.pk, pinned=False).exists()


def test_deleting_a_conversation_counts_its_facts(admin_client, summarized):
    confirm = page(admin_client, url("conversation_delete", summarized.pk))
    assert "Facts: 2" in confirm or "facts: 2" in confirm.lower()


@pytest.mark.parametrize("extra", [0, 40])
def test_the_pages_take_the_same_queries_however_many_facts(
    admin_client, summarized, extra, assert_queries_at_most
):
    summary = Summary.objects.get(conversation=summarized)
    for index in range(extra):
        fact = fact_add(user=summarized.owner, subject=SUBJECT, key=f"k{index}", value="v")
        Fact.objects.filter(pk=fact.pk).update(
            summary=summary, source_conversation=summarized, source_seqs=[index % 8]
        )
        FactChange.objects.create(fact=fact, summary=summary, kind=FactChange.Kind.CREATED)
    review = url("conversation_review", summarized.pk)
    page(admin_client, review)  # the session's first touch is not what is counted

    with assert_queries_at_most(budget.ADMIN_REVIEW):
        page(admin_client, review)
    with assert_queries_at_most(budget.ADMIN_SUMMARY):
        page(admin_client, url("summary_change", summary.pk))
    with assert_queries_at_most(budget.ADMIN_FACT_LIST):
        page(admin_client, url("fact_changelist"))
