"""The admin's reads: the annotated conversation list, pages of messages cut by ``seq``, the
context preview. Each takes a fixed number of queries however long the conversation is."""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.db.models import (
    Count,
    F,
    IntegerField,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    TextField,
    Value,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Greatest

from ctxsum.models import CompactionAttempt, Conversation, Message, Summary, single

PAGE_SIZE = 50
# How many of the active context's newest messages the review page shows in full.
CONTEXT_PREVIEW = 50
# How many sources the list's source filter offers (the most frequent).
SOURCE_CHOICES = 20
# How many of the latest summaries and attempts the review page lists.
RECENT = 10


def metadata_source() -> Cast:
    """The metadata's "source" as text (cast: a JSON key transform compares as JSON)."""
    return Cast(KeyTextTransform("source", "metadata"), output_field=TextField())


def conversation_rows(queryset: QuerySet[Conversation]) -> QuerySet[Conversation]:
    """Conversations with what their list shows, in the same query: ``source`` (the
    metadata's), ``summary_total``, ``tokens_saved`` (archived messages' tokens less the
    active summary's), ``last_outcome`` and ``last_attempt_at``."""
    attempts = CompactionAttempt.objects.filter(conversation=OuterRef("pk")).order_by(
        "-created_at", "-pk"
    )
    active = Summary.objects.filter(conversation=OuterRef("pk"), active=True)
    return queryset.select_related("owner").annotate(
        source=metadata_source(),
        summary_total=F("summary_count"),
        tokens_saved=Greatest(
            Value(0),
            F("archived_tokens") - Coalesce(Subquery(active.values("token_count")[:1]), 0),
            output_field=IntegerField(),
        ),
        last_outcome=Subquery(attempts.values("outcome")[:1]),
        last_attempt_at=Subquery(attempts.values("created_at")[:1]),
    )


def source_choices() -> list[str]:
    """The most frequent metadata sources, most frequent first."""
    rows = (
        Conversation.objects.annotate(source=metadata_source())
        .exclude(source__isnull=True)
        .exclude(source="")
        .values("source")
        .annotate(total=Count("pk"))
        .order_by("-total", "source")[:SOURCE_CHOICES]
    )
    return [row["source"] for row in rows]


@dataclass(frozen=True, kw_only=True)
class SeqPage:
    """One page of messages cut by ``seq``: seq numbers are gapless, so a page is a range
    of the (conversation, seq) index, with no COUNT and no OFFSET however deep it is."""

    number: int
    num_pages: int
    start: int  # the first seq of the page
    stop: int  # one past its last seq
    messages: list[Message]

    @property
    def page_links(self) -> list[int | None]:
        """The page numbers to link: the first, the last and two on either side of this
        one; None where numbers are left out."""
        wanted = {1, self.num_pages, *range(self.number - 2, self.number + 3)}
        numbers = sorted(n for n in wanted if 1 <= n <= self.num_pages)
        links: list[int | None] = []
        for number in numbers:
            if links and number - (links[-1] or 0) > 1:
                links.append(None)
            links.append(number)
        return links


def page_of(seq: int) -> int:
    """The page of the transcript that holds ``seq``."""
    return seq // PAGE_SIZE + 1


def seq_page(messages: QuerySet[Message], *, first: int, last: int, page: object) -> SeqPage:
    """Page ``page`` of ``messages`` with seq ``first``..``last`` (the nearest page when out
    of range, the first when not a number): one query."""
    num_pages = max(1, math.ceil((last - first + 1) / PAGE_SIZE))
    try:
        number = min(max(int(str(page)), 1), num_pages)
    except ValueError:
        number = 1
    start = first + (number - 1) * PAGE_SIZE
    stop = min(start + PAGE_SIZE, last + 1)
    rows = list(messages.filter(seq__gte=start, seq__lt=stop).order_by("seq"))
    return SeqPage(number=number, num_pages=num_pages, start=start, stop=stop, messages=rows)


def transcript_page(conversation: Conversation, page: object) -> SeqPage:
    """A page of the whole transcript, archived and replaced messages included, with the
    summary that archived each one."""
    messages = Message.objects.filter(conversation=conversation).select_related("summary")
    return seq_page(messages, first=0, last=conversation.message_count - 1, page=page)


def covered_page(summary: Summary, page: object) -> SeqPage:
    """A page of the messages ``summary`` covers (from_seq..to_seq, cumulative); a leading
    system message in the range is not summarized, so it is left out."""
    messages = Message.objects.filter(
        conversation_id=summary.conversation_id, is_leading=False
    ).select_related("summary")
    return seq_page(messages, first=summary.from_seq, last=summary.to_seq, page=page)


@dataclass(frozen=True, kw_only=True)
class ContextPreview:
    """The active context as the review page shows it: the pinned system message, the
    active summary, and the newest active messages (``hidden`` older ones left out)."""

    leading: Message | None
    summary: Summary | None
    recent: list[Message]
    hidden: int


def context_preview(conversation: Conversation) -> ContextPreview:
    """Three queries, whatever the length of the context."""
    active = Message.objects.filter(conversation=conversation).active()
    leading = active.filter(is_leading=True).first()
    summary = single(Summary.objects.filter(conversation=conversation, active=True))
    recent = list(active.filter(is_leading=False).order_by("-seq")[:CONTEXT_PREVIEW])[::-1]
    hidden = conversation.active_message_count - len(recent) - (leading is not None)
    return ContextPreview(leading=leading, summary=summary, recent=recent, hidden=max(hidden, 0))


def archived_by(summary: Summary) -> tuple[int, int]:
    """How many messages ``summary`` archived itself, and their tokens: what undoing it
    brings back into the context. One query."""
    totals = Message.objects.filter(summary=summary).aggregate(
        count=Count("pk"), tokens=Coalesce(Sum("token_count"), 0)
    )
    return totals["count"], totals["tokens"]


def recent_summaries(conversation: Conversation) -> list[Summary]:
    return list(Summary.objects.filter(conversation=conversation).order_by("-version")[:RECENT])


def recent_attempts(conversation: Conversation) -> list[CompactionAttempt]:
    attempts = CompactionAttempt.objects.filter(conversation=conversation)
    return list(attempts.select_related("summary").order_by("-created_at", "-pk")[:RECENT])
