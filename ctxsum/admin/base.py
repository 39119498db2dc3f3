"""What the model admins share: read-only registration for the rows only services write,
and the generic admin classes, subscripted for mypy only."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.timezone import localtime
from django.utils.translation import gettext_lazy as _

from ctxsum.models import CompactionAttempt, Conversation, Message, Summary

if TYPE_CHECKING:
    # The admin classes are generic in django-stubs only: subscripted for mypy, bare at run time.
    ConversationModelAdmin = admin.ModelAdmin[Conversation]
    SummaryModelAdmin = admin.ModelAdmin[Summary]
    MessageModelAdmin = admin.ModelAdmin[Message]
    AttemptModelAdmin = admin.ModelAdmin[CompactionAttempt]
else:
    ConversationModelAdmin = SummaryModelAdmin = admin.ModelAdmin
    MessageModelAdmin = AttemptModelAdmin = admin.ModelAdmin


class ReviewMediaMixin:
    """The badges and the review pages' layout (ctxsum/admin/review.css), in the admin's
    colour variables, so light and dark mode both work."""

    class Media:
        css = {"all": ("ctxsum/admin/review.css",)}


class ConversationRowMixin(ReviewMediaMixin):
    """Rows that belong to a conversation, written by the services only: the admin shows
    them and never adds, changes or deletes one (a conversation's delete takes its rows).
    The list shows the conversation's title (linking its review page) and the row's
    creation, 50 rows a page, no full count."""

    list_select_related: ClassVar[bool | list[str] | tuple[str, ...]] = ("conversation",)
    list_per_page = 50
    show_full_result_count = False
    conversation_chars = 32

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    has_change_permission = has_delete_permission = has_add_permission

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: Any) -> str:
        return short_time(obj.created_at)

    @admin.display(description=_("conversation"), ordering="conversation__title")
    def conversation_title(self, obj: Any) -> str:
        return conversation_link(obj.conversation, chars=self.conversation_chars)


def badge(kind: str, text: object, hint: str = "") -> str:
    """A small coloured label (styled by ctxsum/admin/review.css)."""
    html = '<span class="ctxsum-badge ctxsum-{}" title="{}">{}</span>'
    return format_html(html, kind, hint, text)


def conversation_link(conversation: Conversation, *, chars: int = 40) -> str:
    """The conversation's title, shortened, linking its review page (a list column)."""
    url = reverse("admin:ctxsum_conversation_review", args=[conversation.pk])
    return format_html('<a href="{}">{}</a>', url, Truncator(str(conversation)).chars(chars))


def short_time(moment: datetime) -> str:
    """A date and time in the short local format, which wraps in a narrow column."""
    return date_format(localtime(moment), "SHORT_DATETIME_FORMAT")
