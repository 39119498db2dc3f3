"""docs/api.md: key facts, a conversation's and a subject's, added, changed and deleted by a
person, and the facts block they make in the context."""

from __future__ import annotations

from collections.abc import Callable

from ctxsum.conf import ctxsum_settings
from project.api_docs.document import OTHER_USER, Document, Exchange, expect
from project.api_docs.errors import _request, _row

SUBJECT = "maria-keller"
OWN = "/conversations/$CONV/facts/"
SHARED = f"/subjects/{SUBJECT}/facts/"
# A fact's id is a number the database hands out: the page shows it as its variable.
FACT_IDS = {"id", "results.*.id"}
COUNTERS = {"subject", "active_tokens", "facts_tokens", "revision"}


def _tokens(document: Document, conversation: str) -> dict[str, int]:
    data = document.call("GET", f"/conversations/${conversation}/").data
    return {key: data[key] for key in ("active_tokens", "facts_tokens", "revision")}


def key_facts(document: Document) -> None:
    limit = ctxsum_settings.FACTS_MAX_TOKENS
    document.text(
        f"""
        ## Key facts

        Beside the summary, a context may show key facts: one user message after the
        summary, its *facts block*, with a `key: value` line per fact, pinned facts first,
        then the most recently confirmed, up to its budget (`FACTS_TRIGGER_SHARE` of the
        trigger's tokens, at most `FACTS_MAX_TOKENS`: {limit} tokens by default), leaving out
        a fact whose value the summary or a kept message already holds (`in_context` is then
        false). The trigger counts the block like any message. The summarizer writes facts as it
        compacts; a person adds, changes, pins and deletes them here. A conversation's facts
        are its own; a *subject's* are shared by every conversation of yours that names the
        subject (a customer, say). A conversation names one with `subject`, on create or
        with a PATCH:
        """
    )
    before = _tokens(document, "CONV")
    named = document.request("PATCH", "/conversations/$CONV/", {"subject": SUBJECT}, only=COUNTERS)
    expect(
        named.data["facts_tokens"] == before["facts_tokens"],
        "the subject has no facts yet: the block is what the conversation's own facts make",
    )
    document.call("PATCH", "/conversations/$NEW/", {"subject": SUBJECT})
    document.text(
        """
        The "New chat" conversation (`$NEW`) names it too. A fact of the subject, pinned,
        for both (a subject's facts may also come before any conversation names it):
        """
    )
    shared = document.call(
        "POST",
        SHARED,
        {"key": "traveller", "value": "Maria Keller, prefers an aisle seat", "pinned": True},
    )
    document.name("SHARED", str(shared.data["id"]))
    document.show(shared, hide=FACT_IDS)
    expect(shared.data["in_context"] is None, "a subject's list does not say in_context")
    document.text(
        """
        `in_context` is null here: whether a block shows a fact depends on the conversation.
        A fact of the conversation's own (`id` answers the fact's id, `$FACT` below):
        """
    )
    own = document.call(
        "POST",
        OWN,
        {"key": "booking", "value": "NW7Q2K: NW 486, Zurich 10:15 to Lisbon 12:30 on 13 June"},
    )
    document.name("FACT", str(own.data["id"]))
    document.show(own, hide=FACT_IDS)
    document.text(
        """
        The conversation sees both, listed in the block's order, each saying whether its
        block shows it now; its counters moved by the block's tokens:
        """
    )
    document.request("GET", OWN, hide=FACT_IDS)
    after = _tokens(document, "CONV")
    moved = after["active_tokens"] - before["active_tokens"]
    grown = after["facts_tokens"] - before["facts_tokens"]
    expect(moved == grown > 0, "active_tokens moved by what the block grew")
    document.request("GET", "/conversations/$CONV/", only=COUNTERS)
    others = document.call("GET", "/conversations/$NEW/facts/").data["results"]
    expect([fact["key"] for fact in others] == ["traveller"], "$NEW sees the subject's only")
    document.text(
        f"""
        `active_tokens` grew by {moved}, what the block's `facts_tokens` grew: the two new
        facts' lines, beside the facts the summarizer already wrote when it compacted
        `$CONV`. `$NEW` shows the subject's fact as well, not `$CONV`'s own.
        """
    )
    _changes(document)


def _changes(document: Document) -> None:
    document.text(
        """
        A PATCH changes any of `value`, `key` and `pinned`; the fact is a person's from then
        on (`changed_by: "person"`), which the summarizer never overwrites: what it would
        write instead waits in `proposed_value`, and writing a value (the proposed one, to
        accept it) settles the proposal. Every conversation that shows the fact has its
        block recounted and its `revision` moved.
        """
    )
    value = "NW7Q2K: NW 486, Zurich 10:15 to Lisbon 12:30 on 13 June, seat 14C (aisle)"
    document.request("PATCH", f"{OWN}$FACT/", {"value": value}, hide=FACT_IDS)
    new_before = _tokens(document, "NEW")
    document.text(
        """
        Deleting the subject's fact takes it out of both conversations' blocks:
        """
    )
    deleted = document.request("DELETE", f"{SHARED}$SHARED/")
    expect(deleted.status == 204, "deleted")
    new_after = _tokens(document, "NEW")
    expect(
        (new_after["facts_tokens"], new_after["active_tokens"])
        == (0, new_before["active_tokens"] - new_before["facts_tokens"]),
        "the other conversation's block is gone with the fact",
    )
    _refusals(document)


def _refusals(document: Document) -> None:
    document.text(
        """
        Keys are one line of at most 200 characters, values at most 2000, both stripped and
        never blank. A key is normalized as the summarizer's are (lower case, each run of
        characters other than letters and digits one underscore: `Order ID` is `order_id`),
        so a person's fact and the model's are one, and it is unique within its
        conversation or subject. A subject in a path
        is percent-encoded; one that no subject can have (over 200 characters, a control
        character, whitespace at either end, `.` or `..`; a slash never reaches it) answers
        404, as does a fact id that is not one of the caller's facts there. Another user's
        facts are never listed, and their subjects are theirs: the same name lists only
        your own facts.
        """
    )
    rows = [_row("request", "answer"), _row("---", "---")]
    for body in (
        {"key": "Booking", "value": "again"},
        {"key": "two\nlines", "value": "x"},
        {"key": "seat", "value": "  "},
        {"key": "seat", "value": "14C", "pinned": "yes"},
        {"key": "seat", "value": "14C", "subject": SUBJECT},
    ):
        exchange = document.call("POST", OWN, body)
        expect(exchange.status == 400, "refused")
        rows.append(_row(_request(exchange), document.cell(exchange)))
    refused: list[tuple[str, Exchange]] = [
        ("a fact id that is not a number", document.call("GET", f"{OWN}abc/")),
        (
            "`GET $API/conversations/$CONV/facts/$SHARED/` once deleted",
            document.call("GET", f"{OWN}$SHARED/"),
        ),
        ("a subject with a leading space", document.call("GET", "/subjects/%20maria/facts/")),
        ("a subject of 201 characters", document.call("GET", f"/subjects/{'s' * 201}/facts/")),
    ]
    theirs = document.call("GET", SHARED, token=document.tokens[OTHER_USER])
    expect(theirs.status == 200 and theirs.data["count"] == 0, "mallory sees none of it")
    refused.append((f"another user's `GET $API{SHARED}`", theirs))
    rows += [_row(what, document.cell(exchange)) for what, exchange in refused]
    document.text("\n".join(rows))


SECTIONS: tuple[Callable[[Document], None], ...] = (key_facts,)
