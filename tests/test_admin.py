"""The admin as a review workbench: every page and action answers, through the services
only; messages, summaries and attempts are read-only; the edit form refuses what the API
refuses; every piece of message content is escaped; staff only, model permissions
respected; and each page takes the same number of queries for 20 messages as for 10,000."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from ctxsum.admin.actions import ACTION_LIMIT
from ctxsum.models import CompactionAttempt, Conversation, Message, Summary
from ctxsum.services import (
    conversation_create,
    conversation_update,
    message_append,
    message_redact,
)
from ctxsum.services.redaction import REDACTED
from tests import query_budgets as budget
from tests.factories import (
    assistant_calls,
    assistant_message,
    compact,
    long_user_message,
    system_message,
    tool_result,
    turns,
    user_message,
)
from tests.invariants import assert_context_invariants

pytestmark = pytest.mark.django_db

OFFLINE = "ctxsum.summarizers.offline.OfflineSummarizer"
SCRIPT = "<script>alert(1)</script>"
TOOL_HTML = '<img src=x onerror="alert(2)">'
ARGUMENTS = f'{{"city": "Delhi", "note": "{TOOL_HTML.replace(chr(34), chr(39))}"}}'
SECRET = "my card is 4111-1111-1111-1111"
SECRET_SEQ = 7  # the message of agent_history() that holds it


@pytest.fixture(autouse=True)
def offline(settings):
    settings.CTXSUM = {"SUMMARIZER": OFFLINE}


def agent_history() -> list[dict]:
    """A support chat with parallel tool calls, hostile text in a message and in a tool
    argument, and a secret the redaction tests erase."""
    return [
        system_message("You are a travel assistant."),
        long_user_message("A"),
        assistant_message("Noted."),
        user_message("Weather in Delhi and Mumbai?"),
        assistant_calls("call_delhi", "call_mumbai", name="get_weather", arguments=ARGUMENTS),
        tool_result("call_delhi", '{"celsius": 20, "sky": "clear"}'),
        tool_result("call_mumbai", "27 C"),
        assistant_message(f"Delhi is cooler at 20 C. Booked AI-101 for Ana, paid by {SECRET}."),
        long_user_message(f"B {SCRIPT}"),
        assistant_message("Done."),
        user_message("Thanks."),
        assistant_message("Bye."),
    ]


def agent_conversation(owner, **fields) -> Conversation:
    """The agent chat, compacted once with two messages kept."""
    conversation = conversation_create(
        owner=owner,
        title=fields.pop("title", "Trip to Delhi"),
        messages=agent_history(),
        keep={"messages": 2},
        metadata={"source": "tests/agent"},
        **fields,
    )
    compact(conversation)
    return conversation


@pytest.fixture
def conversation(user) -> Conversation:
    return agent_conversation(user)


def url(name: str, *args) -> str:
    return reverse(f"admin:ctxsum_{name}", args=args)


def page(client: Client, address: str, status: int = 200) -> str:
    response = client.get(address)
    assert response.status_code == status, response.content[:2000]
    return response.content.decode()


def every_page(conversation: Conversation) -> list[str]:
    summary = Summary.objects.get(conversation=conversation, active=True)
    message = Message.objects.filter(conversation=conversation).first()
    attempt = CompactionAttempt.objects.filter(conversation=conversation).first()
    return [
        url("conversation_changelist"),
        url("conversation_review", conversation.pk),
        url("conversation_change", conversation.pk),
        url("conversation_delete", conversation.pk),
        url("conversation_history", conversation.pk),
        url("conversation_redact", conversation.pk, SECRET_SEQ),
        url("conversation_revert", conversation.pk, summary.version),
        url("summary_changelist"),
        url("summary_change", summary.pk),
        url("message_changelist"),
        url("message_change", message.pk),
        url("compactionattempt_changelist"),
        url("compactionattempt_change", attempt.pk),
    ]


# --- every page ----------------------------------------------------------------------------


def test_every_page_answers(admin_client, conversation):
    for address in every_page(conversation):
        page(admin_client, address)


@pytest.mark.parametrize("model", ["conversation", "summary", "message", "compactionattempt"])
def test_every_list_sorts_on_every_column(admin_client, conversation, model):
    from django.contrib import admin

    model_admin = admin.site.get_model_admin(
        {"conversation": Conversation, "summary": Summary, "message": Message}.get(
            model, CompactionAttempt
        )
    )
    for order in range(1, len(model_admin.list_display) + 1):
        for sign in ("", "-"):
            page(admin_client, url(f"{model}_changelist") + f"?o={sign}{order}")


def test_the_list_shows_what_a_reviewer_sorts_on(admin_client, conversation, user):
    conversation_create(owner=user, title="Untouched", messages=turns(3))
    html = page(admin_client, url("conversation_changelist"))

    assert url("conversation_review", conversation.pk) in html
    assert "tests/agent" in html  # the source, under the title
    assert "ctxsum/admin/review.css" in html  # the badges' styles
    assert 'class="ctxsum-badge ctxsum-compacted"' in html
    row = Conversation.objects.filter(pk=conversation.pk)
    archived = Message.objects.filter(conversation=conversation, summary__isnull=False)
    saved = sum(m.token_count for m in archived) - row.get().summaries.get(active=True).token_count
    assert f">{saved:,}<" in html


def test_the_review_page_shows_the_context_as_a_chat(admin_client, conversation):
    html = page(admin_client, url("conversation_review", conversation.pk))
    summary = Summary.objects.get(conversation=conversation, active=True)

    assert "Active context" in html and "ctxsum-summary-msg" in html
    assert url("summary_change", summary.pk) in html
    assert "Archived by summary v1" in html  # the transcript, grouped
    assert "In the active context" in html
    # Tool calls: the function's name and its arguments pretty-printed; results name it.
    assert "get_weather" in html and "call_mumbai" in html
    assert "&quot;city&quot;: &quot;Delhi&quot;," in html  # indented JSON, one key a line
    assert "result of <strong>get_weather</strong>" in html
    assert "&quot;celsius&quot;: 20," in html  # a JSON tool result, pretty-printed too
    assert html.count('class="ctxsum-msg ctxsum-role-') >= len(agent_history())
    every_version = url("summary_changelist") + f"?conversation={conversation.pk}"
    assert every_version in html
    assert url("summary_change", summary.pk) in page(admin_client, every_version)


def test_the_change_page_links_the_review_page(admin_client, conversation):
    html = page(admin_client, url("conversation_change", conversation.pk))
    assert url("conversation_review", conversation.pk) in html


def test_the_summary_page_shows_text_range_lineage_and_coverage(admin_client, conversation):
    v1 = Summary.objects.get(conversation=conversation, active=True)
    message_append(conversation=conversation, messages=[long_user_message("C"), *turns(3)])
    conversation_update(conversation=conversation, keep={"messages": 1})
    compact(conversation)
    v2 = Summary.objects.get(conversation=conversation, active=True)

    html = page(admin_client, url("summary_change", v2.pk))

    assert f"#{v2.from_seq}\N{EN DASH}#{v2.to_seq}" in html
    assert url("summary_change", v1.pk) in html  # lineage: back to v1
    assert "Changes from v1" in html and "<ins>" in html
    assert "version 1" in html and "ctxsum-current" in html
    assert "41 %" in html or "%" in html  # the coverage ratio
    assert f"{v2.input_tokens} in, {v2.output_tokens} out" in html
    # Every covered message is on the page (one page here), those v2 archived marked.
    covered = Message.objects.filter(
        conversation=conversation, seq__gte=v2.from_seq, seq__lte=v2.to_seq, is_leading=False
    )
    assert html.count('<article id="m') == covered.count()
    newly = covered.filter(summary=v2).count()
    assert newly and html.count("ctxsum-newly-badge") == newly
    assert url("summary_change", v2.pk) in page(admin_client, url("summary_change", v1.pk))


def test_the_coverage_facts_are_listed_present_and_missing(admin_client, conversation):
    summary = Summary.objects.get(conversation=conversation, active=True)
    summary.coverage_facts = [
        {"kind": "name", "text": "Ana", "present": True},
        {"kind": "identifier", "text": "ZX-9", "present": False},
    ]
    summary.coverage = 0.5
    Summary.objects.filter(pk=summary.pk).update(
        coverage=summary.coverage, coverage_facts=summary.coverage_facts
    )
    html = page(admin_client, url("summary_change", summary.pk))
    missing, present = html.split("<strong>Missing</strong>")[1].split("<strong>Present</strong>")
    assert "ZX-9" in missing and "Ana" not in missing
    assert "Ana" in present
    assert "1 of 2 facts present" in html and "50 %" in html


def transcript(client: Client, conversation: Conversation, query: str = "") -> str:
    """The transcript part of the review page."""
    html = page(client, url("conversation_review", conversation.pk) + query)
    return html.split('id="transcript"')[1]


def test_a_long_transcript_is_paged_by_seq(admin_client, user):
    conversation = conversation_create(owner=user, messages=turns(120))
    first = transcript(admin_client, conversation)
    third = transcript(admin_client, conversation, "?page=3")

    assert 'id="m0"' in first and 'id="m49"' in first and 'id="m50"' not in first
    assert 'id="m100"' in third and 'id="m119"' in third and 'id="m99"' not in third
    assert "?page=2#transcript" in third
    # Out of range or not a number: the nearest page.
    assert 'id="m119"' in transcript(admin_client, conversation, "?page=99")
    assert 'id="m0"' in transcript(admin_client, conversation, "?page=x")


def test_the_context_preview_shows_the_newest_messages(admin_client, user):
    conversation = conversation_create(owner=user, system="Be brief.", messages=turns(80))
    html = page(admin_client, url("conversation_review", conversation.pk))
    context = html.split('id="transcript"')[0]
    assert "30 older active messages are not shown here" in context
    assert 'id="m80"' in context and 'id="m30"' not in context and 'id="m0"' in context


# --- escaping --------------------------------------------------------------------------------


def test_message_content_and_tool_arguments_render_as_text(admin_client, user):
    conversation = agent_conversation(user, title=f"Title {SCRIPT}")
    summary = Summary.objects.get(conversation=conversation, active=True)
    assert SCRIPT in summary.text  # the offline summarizer copies sentences verbatim

    addresses = [*every_page(conversation), url("conversation_changelist") + "?q=alert"]
    for address in addresses:
        markup = Markup()
        markup.feed(page(admin_client, address))
        assert not markup.alerts and not markup.handlers, address
    review = page(admin_client, url("conversation_review", conversation.pk))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in review
    assert "&lt;img src=x onerror=" in review
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page(
        admin_client, url("summary_change", summary.pk)
    )


class Markup(HTMLParser):
    """What a browser would run: scripts that call alert, and event handler attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.alerts: list[str] = []
        self.handlers: list[tuple[str, str | None]] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_script = tag == "script"
        self.handlers += [(name, value) for name, value in attrs if name.startswith("on")]

    def handle_data(self, data: str) -> None:
        if self._in_script and "alert(" in data:
            self.alerts.append(data)


def test_the_word_diff_escapes_both_versions():
    from ctxsum.admin.rendering import word_diff

    runs = word_diff("Ana flies <b>Monday</b>.", f"Ana flies {SCRIPT} Tuesday.")
    assert ("same", "Ana flies ") in runs
    assert ("removed", "<b>Monday</b>.") in runs
    assert ("added", f"{SCRIPT} Tuesday.") in runs  # text: the template escapes it


# --- who may do what -------------------------------------------------------------------------


def test_a_non_staff_user_reaches_no_page(client, user, conversation):
    client.force_login(user)  # logged in, but not staff
    for address in every_page(conversation):
        response = client.get(address)
        assert response.status_code == 302, address
        assert response["Location"].startswith(reverse("admin:login")), address
    response = client.post(url("conversation_redact", conversation.pk, SECRET_SEQ))
    assert response.status_code == 302
    assert REDACTED not in str(Message.objects.get(conversation=conversation, seq=2).content)


@pytest.mark.parametrize("model", ["message", "summary", "compactionattempt"])
def test_rows_written_by_services_cannot_be_added_changed_or_deleted(
    admin_client, conversation, model
):
    obj = {
        "message": Message.objects.filter(conversation=conversation).first(),
        "summary": Summary.objects.filter(conversation=conversation).first(),
        "compactionattempt": CompactionAttempt.objects.filter(conversation=conversation).first(),
    }[model]
    assert admin_client.get(url(f"{model}_add")).status_code == 403
    assert admin_client.get(url(f"{model}_delete", obj.pk)).status_code == 403
    assert admin_client.post(url(f"{model}_delete", obj.pk), {"post": "yes"}).status_code == 403
    assert admin_client.post(url(f"{model}_change", obj.pk), {}).status_code in (403, 405)
    changelist = page(admin_client, url(f"{model}_changelist"))
    assert "delete_selected" not in changelist and url(f"{model}_add") not in changelist
    response = admin_client.post(
        url(f"{model}_changelist"), {"action": "delete_selected", "_selected_action": [obj.pk]}
    )
    assert type(obj).objects.filter(pk=obj.pk).exists()
    assert response.status_code in (200, 302)
    assert admin_client.get(url("conversation_add")).status_code == 403


def staff_with(django_user_model, *codenames: str) -> Client:
    staff = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(staff)
    return client


def test_view_permission_shows_without_changing(django_user_model, conversation):
    client = staff_with(django_user_model, "view_conversation", "view_summary", "view_message")
    review = page(client, url("conversation_review", conversation.pk))
    assert "Redact" not in review and ">Details<" in review
    change = page(client, url("conversation_change", conversation.pk))
    assert 'name="title"' not in change  # read-only
    response = client.post(url("conversation_change", conversation.pk), {"title": "x"})
    assert response.status_code == 403
    assert client.get(url("conversation_delete", conversation.pk)).status_code == 403
    assert client.get(url("conversation_redact", conversation.pk, SECRET_SEQ)).status_code == 403
    changelist = page(client, url("conversation_changelist"))
    assert 'value="compact_dry_run"' in changelist
    assert 'value="compact_now"' not in changelist and 'value="rebuild_stale"' not in changelist
    page(client, url("summary_change", Summary.objects.get(conversation=conversation).pk))
    assert client.get(url("compactionattempt_changelist")).status_code == 403


def test_without_view_permission_the_review_pages_are_refused(django_user_model, conversation):
    client = staff_with(django_user_model, "view_message")
    assert client.get(url("conversation_review", conversation.pk)).status_code == 403
    summary = Summary.objects.get(conversation=conversation)
    assert client.get(url("summary_change", summary.pk)).status_code == 403


# --- the edit form ---------------------------------------------------------------------------


def form_data(conversation: Conversation, **changes) -> dict[str, str]:
    data = {
        "title": conversation.title,
        "model": conversation.model,
        "metadata": '{"source": "tests/agent"}',
        "trigger": "",
        "keep": '{"messages": 2}',
        "max_context_tokens": "",
    }
    return {**data, **changes}


def test_the_form_saves_through_the_service(admin_client, conversation):
    revision = conversation.revision
    response = admin_client.post(
        url("conversation_change", conversation.pk),
        form_data(conversation, title="Delhi, in October", trigger='{"messages": 30}'),
    )
    assert response.status_code == 302
    conversation.refresh_from_db()
    assert (conversation.title, conversation.trigger) == ("Delhi, in October", {"messages": 30})
    assert conversation.revision == revision + 1  # conversation_update moved it, once
    assert_context_invariants(conversation)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"trigger": '{"messages": 3}'}, "keep"),  # keep 2 + 3 pinned leaves no room
        ({"keep": '{"messages": 2, "tokens": 5}'}, "keep"),
        ({"trigger": '{"minutes": 5}'}, "trigger"),
        ({"trigger": "[1, 2]"}, "trigger"),
        ({"max_context_tokens": "0"}, "max_context_tokens"),
        ({"metadata": "[1]"}, "metadata"),
        ({"title": "x" * 201}, "title"),
        ({"model": "m" * 101}, "model"),
    ],
)
def test_an_invalid_value_is_refused_on_its_field(admin_client, conversation, changes, field):
    before = Conversation.objects.values().get(pk=conversation.pk)
    response = admin_client.post(
        url("conversation_change", conversation.pk), form_data(conversation, **changes)
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert Conversation.objects.values().get(pk=conversation.pk) == before  # nothing saved


def test_the_counters_and_the_lease_are_read_only(admin_client, conversation):
    before = Conversation.objects.values().get(pk=conversation.pk)
    admin_client.post(
        url("conversation_change", conversation.pk),
        form_data(conversation, message_count="0", active_tokens="1", lease_owner="me"),
    )
    after = Conversation.objects.values().get(pk=conversation.pk)
    for name in ("message_count", "active_tokens", "lease_owner", "revision", "next_seq"):
        assert after[name] == before[name]


def test_deleting_a_conversation_takes_its_rows(admin_client, conversation):
    confirm = page(admin_client, url("conversation_delete", conversation.pk))
    count = Message.objects.filter(conversation=conversation).count()
    assert f"Messages: {count}" in confirm or f"messages: {count}" in confirm.lower()
    response = admin_client.post(url("conversation_delete", conversation.pk), {"post": "yes"})
    assert response.status_code == 302
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()


def test_the_delete_action_goes_through_the_service_too(admin_client, user):
    chats = [agent_conversation(user, title=f"chat {i}") for i in range(2)]
    data = {"action": "delete_selected", "_selected_action": [str(c.pk) for c in chats]}
    confirm = admin_client.post(url("conversation_changelist"), data)
    assert confirm.status_code == 200 and b"Summaries: 2" in confirm.content
    admin_client.post(url("conversation_changelist"), {**data, "post": "yes"})
    assert not Conversation.objects.exists() and not Summary.objects.exists()


# --- actions ---------------------------------------------------------------------------------


def act(client: Client, action: str, conversations, **extra) -> list[str]:
    response = client.post(
        url("conversation_changelist"),
        {"action": action, "_selected_action": [str(c.pk) for c in conversations], **extra},
        follow=True,
    )
    assert response.status_code == 200
    return [str(message) for message in response.context["messages"]]


def test_compact_now_counts_what_it_did(admin_client, user):
    ready = conversation_create(owner=user, messages=agent_history(), keep={"messages": 2})
    tiny = conversation_create(owner=user, messages=[user_message("hi")])

    said = act(admin_client, "compact_now", [ready, tiny])

    assert said[0] == "1 compacted, 1 had nothing to summarize"
    assert Summary.objects.filter(conversation=ready).count() == 1


def test_dry_run_says_what_would_happen_and_writes_nothing(admin_client, user):
    ready = conversation_create(owner=user, messages=agent_history(), keep={"messages": 2})
    said = act(admin_client, "compact_dry_run", [ready])
    assert said[0] == "1 would compact"
    assert re.match(r"Trip|.*: would archive \d+ messages \(seq 1-\d+\), \d+ -> about \d+", said[1])
    assert not Summary.objects.exists() and not CompactionAttempt.objects.exists()


def test_a_failed_summarizer_is_counted_and_the_others_go_on(admin_client, user, settings):
    settings.CTXSUM = {
        "SUMMARIZER": "ctxsum.summarizers.openai.OpenAISummarizer",
        "SUMMARIZER_OPTIONS": {"base_url": "http://127.0.0.1:9/v1", "api_key": "x"},
        "SUMMARY_TIMEOUT": 1,
    }
    ready = conversation_create(owner=user, messages=agent_history(), keep={"messages": 2})
    said = act(admin_client, "compact_now", [ready])
    assert said[0] == "1 failed"
    assert said[1].startswith(f"{ready}: failed:")
    assert CompactionAttempt.objects.get().outcome == "failed"


def test_the_selection_is_capped(admin_client, user):
    chats = [conversation_create(owner=user, messages=turns(2)) for _ in range(ACTION_LIMIT + 1)]
    for action, command in [
        ("compact_now", "ctxsum_compact --all"),
        ("compact_dry_run", "ctxsum_compact --all"),
        ("rebuild_stale", "ctxsum_rebuild --stale"),
    ]:
        said = act(admin_client, action, chats)
        assert said == [
            f"Select at most {ACTION_LIMIT} conversations at a time; for more, run "
            f"“manage.py {command}{' --force' if 'compact' in command else ''}”."
        ]
    assert not CompactionAttempt.objects.exists()
    # "Select all" across pages counts as the whole list.
    said = act(admin_client, "compact_now", chats[:1], select_across="1")
    assert said[0].startswith("Select at most")


def test_after_a_prompt_change_the_stale_filter_and_the_rebuild_action(
    admin_client, user, settings
):
    stale = agent_conversation(user, title="stale one")
    never = conversation_create(owner=user, title="never summarized", messages=turns(4))
    old = Summary.objects.get(conversation=stale)
    assert "stale one" not in page(admin_client, url("conversation_changelist") + "?stale=yes")

    settings.CTXSUM = {**settings.CTXSUM, "PROMPT_VERSION": "2"}
    listed = page(admin_client, url("summary_changelist") + "?stale=yes")
    assert url("summary_change", old.pk) in listed and "ctxsum-stale" in listed
    conversations = page(admin_client, url("conversation_changelist") + "?stale=yes")
    assert "stale one" in conversations and "never summarized" not in conversations
    assert "never summarized" in page(admin_client, url("conversation_changelist") + "?stale=no")
    fresh = agent_conversation(user, title="fresh one")  # under prompt version 2

    said = act(admin_client, "rebuild_stale", [stale, never, fresh])

    assert said[0] == "1 rebuilt, 1 had nothing to rebuild, 1 not stale"
    new = Summary.objects.get(conversation=stale, active=True)
    assert (new.from_seq, new.to_seq, new.origin, new.prompt_version) == (
        old.from_seq,
        old.to_seq,
        "rebuild",
        "2",
    )
    old.refresh_from_db()
    assert old.superseded and not old.active  # the old version remains
    assert "stale one" not in page(admin_client, url("conversation_changelist") + "?stale=yes")
    stale_summaries = page(admin_client, url("summary_changelist") + "?stale=yes")
    assert url("summary_change", old.pk) in stale_summaries  # superseded, still stale
    assert url("summary_change", new.pk) not in stale_summaries
    rebuilt = page(admin_client, url("summary_change", new.pk))
    assert "Rebuild" in rebuilt and "ctxsum-current" in rebuilt


# --- redaction -------------------------------------------------------------------------------


def test_redact_asks_first_then_erases_through_the_service(admin_client, conversation):
    seq = SECRET_SEQ
    summary = Summary.objects.get(conversation=conversation, active=True)
    assert SECRET in summary.text
    review = page(admin_client, url("conversation_review", conversation.pk))
    assert url("conversation_redact", conversation.pk, seq) in review

    confirm = page(admin_client, url("conversation_redact", conversation.pk, seq))
    assert "csrfmiddlewaretoken" in confirm and 'method="post"' in confirm
    assert SECRET in confirm and "v1" in confirm  # what goes, and what turns stale
    assert SECRET in str(Message.objects.get(conversation=conversation, seq=seq).content)

    response = admin_client.post(url("conversation_redact", conversation.pk, seq))
    assert response.status_code == 302
    assert response["Location"].endswith(f"?page=1#m{seq}")
    message = Message.objects.get(conversation=conversation, seq=seq)
    assert message.content == REDACTED and message.redacted_at
    summary.refresh_from_db()
    assert summary.covers_redacted
    review = page(admin_client, url("conversation_review", conversation.pk))
    message_html = review.split(f'id="m{seq}"')[1].split("</article>")[0]
    assert SECRET not in message_html and "[redacted]" in message_html
    assert url("conversation_redact", conversation.pk, seq) not in review  # done already
    assert "stale one" not in review
    # Then the rebuild takes the secret out of the summary.
    said = act(admin_client, "rebuild_stale", [conversation])
    assert said[0] == "1 rebuilt"
    assert SECRET not in Summary.objects.get(conversation=conversation, active=True).text


def test_redact_needs_the_csrf_token_and_the_change_message_permission(
    django_user_model, conversation
):
    staff = django_user_model.objects.create_user("csrf", password="pw", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename="view_conversation"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    address = url("conversation_redact", conversation.pk, SECRET_SEQ)
    assert client.post(address).status_code == 403  # no CSRF token
    assert client.get(address).status_code == 403  # no change_message permission
    staff.user_permissions.add(Permission.objects.get(codename="change_message"))
    html = page(client, address)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    assert client.post(address, {"csrfmiddlewaretoken": token}).status_code == 302
    assert Message.objects.get(conversation=conversation, seq=SECRET_SEQ).content == REDACTED
    assert page(client, url("conversation_redact", conversation.pk, 999), 404)


# --- filters and search ----------------------------------------------------------------------


def test_conversation_filters_and_search(admin_client, user):
    summarized = agent_conversation(user, title="summarized")
    plain = conversation_create(
        owner=user,
        title="plain",
        messages=[user_message('the word zanzibar, "quoted", mañana, Ñandú and 東京')],
        metadata={"source": "elsewhere"},
    )
    listing = url("conversation_changelist")

    def titles(query: str) -> set[str]:
        html = page(admin_client, f"{listing}?{query}")
        return {name for name in ("summarized", "plain") if f">{name}</a>" in html}

    assert titles("has_summaries=yes") == {"summarized"}
    assert titles("has_summaries=no") == {"plain"}
    assert titles("last_outcome=compacted") == {"summarized"}
    assert titles("last_outcome=never") == {"plain"}
    assert titles("source=elsewhere") == {"plain"}
    assert titles("source=tests%2Fagent") == {"summarized"}
    assert titles("q=zanzibar") == {"plain"}  # a word in a message
    for words in ("mañana", "東京", "Ñandú", '"quoted"'):  # as typed, on every database
        assert titles(urlencode({"q": words})) == {"plain"}, words
    assert titles("q=summarized") == {"summarized"}  # the title
    assert titles("q=alice") == {"summarized", "plain"}  # the owner
    assert "elsewhere" in page(admin_client, listing)  # offered as a source filter
    assert summarized.pk and plain.pk


def test_message_filters_and_search(admin_client, user):
    conversation = agent_conversation(user)
    message_redact(conversation=conversation, seq=SECRET_SEQ)
    message_append(conversation=conversation, messages=[user_message("¿Mañana a Tōkyō?")])
    conversation_update(conversation=conversation, system="You book trips.")
    listing = url("message_changelist")
    rows = Message.objects.filter(conversation=conversation)

    def seqs(query: str) -> set[int]:
        html = page(admin_client, f"{listing}?{query}")
        return {row.seq for row in rows if url("message_change", row.pk) in html}

    assert seqs("state=archived") == set(rows.archived().values_list("seq", flat=True))
    assert seqs("state=active") == set(rows.active().values_list("seq", flat=True))
    assert seqs("state=replaced") == {0}  # the first system prompt
    assert seqs("state=redacted") == {SECRET_SEQ}
    assert seqs("state=archived") and seqs("state=active")
    newest = rows.count() - 1
    assert seqs(urlencode({"q": "You book trips."})) == {newest}  # the new system prompt
    assert seqs(urlencode({"q": "mañana a tōkyō"})) == {newest - 1}  # any case, any script
    assert seqs(urlencode({"q": "Ñandú"})) == set()


def test_summary_filters(admin_client, user):
    conversation = agent_conversation(user)
    summary = Summary.objects.get(conversation=conversation)
    listing = url("summary_changelist")
    link = url("summary_change", summary.pk)
    for ratio, below_50, below_80 in [(0.3, True, True), (0.6, False, True), (0.9, False, False)]:
        Summary.objects.filter(pk=summary.pk).update(coverage=ratio)
        assert (link in page(admin_client, f"{listing}?coverage=50")) is below_50
        assert (link in page(admin_client, f"{listing}?coverage=80")) is below_80
    assert link in page(admin_client, f"{listing}?origin=compaction")
    assert link not in page(admin_client, f"{listing}?origin=rebuild")
    assert link in page(admin_client, f"{listing}?stale=no")
    assert link not in page(admin_client, f"{listing}?stale=yes")


# --- queries ---------------------------------------------------------------------------------


def build(owner, size: int) -> Conversation:
    """``size`` messages through the services (a system prompt, then turns appended in
    batches), compacted once by the offline summarizer, ten kept."""
    conversation = conversation_create(
        owner=owner,
        title=f"{size} messages",
        system="You are a weather bot.",
        keep={"messages": 10},
        metadata={"source": "bench"},
    )
    history = turns(size - 1, "turn {i}: the weather in city {i} for flight AI-{i}")
    for start in range(0, len(history), 1000):
        message_append(conversation=conversation, messages=history[start : start + 1000])
    compact(conversation)
    assert conversation.message_count == size
    return conversation


@pytest.mark.slow
def test_pages_take_the_same_queries_for_20_and_10000_messages(
    admin_client, user, assert_queries_at_most
):
    small = build(user, 20)
    with assert_queries_at_most(budget.ADMIN_LIST):
        page(admin_client, url("conversation_changelist"))
    big = build(user, 10_000)
    with assert_queries_at_most(budget.ADMIN_LIST):
        page(admin_client, url("conversation_changelist"))

    for conversation in (small, big):
        summary = Summary.objects.get(conversation=conversation)
        last = (conversation.message_count - 1) // 50 + 1
        for suffix in ("", f"?page={last}"):
            with assert_queries_at_most(budget.ADMIN_REVIEW):
                page(admin_client, url("conversation_review", conversation.pk) + suffix)
            with assert_queries_at_most(budget.ADMIN_SUMMARY):
                page(admin_client, url("summary_change", summary.pk) + suffix)

    deep = transcript(admin_client, big, "?page=150")
    assert 'id="m7450"' in deep and 'id="m7499"' in deep and deep.count('<article id="m') == 50


@pytest.mark.django_db(transaction=True)
def test_the_actions_run_outside_atomic_requests(admin_client, user, settings, monkeypatch):
    # With ATOMIC_REQUESTS the summarizer would run inside the request's transaction, its
    # lease invisible to other workers until the response: the list opts out.
    from django.db import connection

    from tests.backends import HookSummarizer

    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    settings.CTXSUM = {"SUMMARIZER": "tests.backends.HookSummarizer"}
    seen: list[bool] = []
    monkeypatch.setattr(HookSummarizer, "during", lambda: seen.append(connection.in_atomic_block))
    ready = conversation_create(owner=user, messages=agent_history(), keep={"messages": 2})

    assert act(admin_client, "compact_now", [ready]) == ["1 compacted"]
    assert seen == [False]
