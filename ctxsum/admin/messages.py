"""Messages: read-only, one row per stored message; each links to its place in the
conversation's review page."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from ctxsum.admin import filters
from ctxsum.admin.base import ConversationRowMixin, MessageModelAdmin
from ctxsum.admin.queries import page_of
from ctxsum.admin.rendering import content_blocks
from ctxsum.models import Message


@admin.register(Message)
class MessageAdmin(ConversationRowMixin, MessageModelAdmin):
    list_display = ("seq", "conversation_title", "role", "preview", "tokens", "state")
    list_filter = (filters.MessageStateFilter, "role")
    list_select_related = ("conversation", "summary")
    search_fields = ("conversation__id", "tool_call_id")
    search_help_text = _("Conversation id, tool call id, or words in the message.")
    readonly_fields = ("in_review", *(field.name for field in Message._meta.fields))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Message], search_term: str
    ) -> tuple[QuerySet[Message], bool]:
        """Also the messages holding the whole search term."""
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if term:
            holding = Message.objects.containing(term).values("pk")
            results = results | queryset.filter(pk__in=holding)
        return results, may_have_duplicates

    @admin.display(description=_("content"))
    def preview(self, obj: Message) -> str:
        text = " ".join(block.text for block in content_blocks(obj))
        if obj.tool_calls:
            text += " " + ", ".join(str(call["function"]["name"]) for call in obj.tool_calls)
        return Truncator(" ".join(text.split())).chars(80)

    @admin.display(description=_("tokens"), ordering="token_count")
    def tokens(self, obj: Message) -> int:
        return obj.token_count

    @admin.display(description=_("state"))
    def state(self, obj: Message) -> str:
        """Active, replaced (a retired system prompt), or the summary version that
        archived it."""
        if obj.summary is not None:
            return f"v{obj.summary.version}"
        return str(_("replaced") if obj.replaced_at else _("active"))

    @admin.display(description=_("in the conversation"))
    def in_review(self, obj: Message) -> str:
        url = reverse("admin:ctxsum_conversation_review", args=[obj.conversation_id])
        return format_html(
            '<a href="{}?page={}#m{}">{}</a>', url, page_of(obj.seq), obj.seq, _("review page")
        )
