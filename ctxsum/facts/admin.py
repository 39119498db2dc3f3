"""Key facts: the list (searched by key and value, filtered by pin, author and scope), each
fact's source messages one click away, and the only writes staff make here, pinning,
unpinning and deleting, through ``ctxsum.facts.services``. A fact's value is never edited in the
admin: the owner does that over REST."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import F, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ctxsum.admin.base import (
    RefusalMixin,
    ReviewMediaMixin,
    badge,
    conversation_link,
    short_time,
)
from ctxsum.facts import panels, services
from ctxsum.facts.models import Fact
from ctxsum.facts.panels import FactRow

if TYPE_CHECKING:
    FactModelAdmin = admin.ModelAdmin[Fact]
else:
    FactModelAdmin = admin.ModelAdmin


def sources_html(fact: Fact) -> str:
    """The links to ``fact``'s source messages, ``#seq`` each; blank without any."""
    row = FactRow(fact=fact)
    if not row.sources:
        return ""
    html = format_html_join(" ", '<a href="{}">#{}</a>', ((s.url, s.seq) for s in row.sources))
    return format_html("{}{}", html, f" … (+{row.more_sources})" if row.more_sources else "")


class ScopeFilter(admin.SimpleListFilter):
    title = _("scope")
    parameter_name = "scope"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Any:
        return (("conversation", _("a conversation's")), ("subject", _("a subject's")))

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() not in ("conversation", "subject"):
            return None
        return queryset.filter(conversation__isnull=self.value() == "subject")


@admin.register(Fact)
class FactAdmin(RefusalMixin, ReviewMediaMixin, FactModelAdmin):
    list_display = ("fact", "scope", "pinned", "author", "sources", "tokens", "confirmed")
    list_display_links = ("fact",)
    list_filter = ("pinned", "changed_by", ScopeFilter)
    list_select_related = ("conversation", "owner")
    list_per_page = 50
    show_full_result_count = False
    search_fields = ("key", "value", "subject")
    search_help_text = _("Words in the key, the value or the subject.")
    ordering = ("-confirmed_at", "-pk")
    actions = ("pin", "unpin", "delete_selected")
    fields = (
        "key",
        "value",
        "scope",
        "owner",
        "pinned",
        "author",
        "summary_version",
        "proposed_value",
        "proposal_version",
        "sources",
        "token_count",
        "confirmed_at",
        "created_at",
        "updated_at",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Fact]:
        return (
            super()
            .get_queryset(request)
            .select_related("conversation", "owner", "changed_by_user")
            .annotate(
                summary_version=F("summary__version"),
                proposal_version=F("proposed_by__version"),
            )
        )

    # --- read-only, but for pins and deletes ----------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # facts come from the summarizer and from their owners, over REST

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the form is read-only; pinning is an action

    def has_pin_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("ctxsum_facts.change_fact"))

    def delete_model(self, request: HttpRequest, obj: Fact) -> None:
        services.fact_delete(fact=obj, user=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Fact]) -> None:
        for fact in queryset:
            services.fact_delete(fact=fact, user=request.user)

    @admin.action(description=_("Pin the selected facts"), permissions=["pin"])
    def pin(self, request: HttpRequest, queryset: QuerySet[Fact]) -> None:
        self._pin(request, queryset, pinned=True)

    @admin.action(description=_("Unpin the selected facts"), permissions=["pin"])
    def unpin(self, request: HttpRequest, queryset: QuerySet[Fact]) -> None:
        self._pin(request, queryset, pinned=False)

    def _pin(self, request: HttpRequest, queryset: Iterable[Fact], *, pinned: bool) -> None:
        """Pin or unpin each fact that is not so already, each in its own transaction (a
        subject's fact recounts every conversation of the subject)."""
        changed = 0
        for fact in queryset:
            if fact.pinned != pinned:
                try:
                    services.fact_change(fact=fact, user=request.user, pinned=pinned)
                except Fact.DoesNotExist:
                    continue  # deleted meanwhile
                self.log_change(request, fact, "Pinned." if pinned else "Unpinned.")
                changed += 1
        text = (
            ngettext("%(count)d fact pinned.", "%(count)d facts pinned.", changed)
            if pinned
            else ngettext("%(count)d fact unpinned.", "%(count)d facts unpinned.", changed)
        )
        self.message_user(request, text % {"count": changed}, messages.SUCCESS)

    # --- columns and fields -----------------------------------------------------------------

    @admin.display(description=_("fact"), ordering="key")
    def fact(self, obj: Fact) -> str:
        """The key, and the value shortened under it (plain text: escaped)."""
        return format_html(
            "<strong>{}</strong><br><small>{}</small>",
            Truncator(obj.key).chars(60),
            Truncator(" ".join(obj.value.split())).chars(120),
        )

    @admin.display(description=_("scope"), ordering="subject")
    def scope(self, obj: Fact) -> str:
        """The conversation's title, linking its review page, or the subject."""
        if obj.conversation is not None:
            return conversation_link(obj.conversation, chars=32)
        return format_html("{} {}", badge("subject", gettext("subject")), obj.subject)

    @admin.display(description=_("changed by"), ordering="changed_by")
    def author(self, obj: Fact) -> str:
        """The model (and which summary version), or a person (and who)."""
        if obj.changed_by == Fact.ChangedBy.PERSON:
            who = obj.changed_by_user or ""
            return format_html("{} {}", badge("person", gettext("person")), who)
        version = getattr(obj, "summary_version", None)
        label = badge("model", gettext("model"))
        return format_html("{} v{}", label, version) if version else label

    @admin.display(description=_("source messages"))
    def sources(self, obj: Fact) -> str:
        return sources_html(obj) or str(self.get_empty_value_display())

    @admin.display(description=_("tokens"), ordering="token_count")
    def tokens(self, obj: Fact) -> int:
        return obj.token_count

    @admin.display(description=_("confirmed"), ordering="confirmed_at")
    def confirmed(self, obj: Fact) -> str:
        return short_time(obj.confirmed_at)

    @admin.display(description=_("summary version"))
    def summary_version(self, obj: Fact) -> str:
        """The version that wrote the value, linking its review page."""
        return self._version_link(obj.summary_id, getattr(obj, "summary_version", "?"))

    @admin.display(description=_("proposed by"))
    def proposal_version(self, obj: Fact) -> str:
        return self._version_link(obj.proposed_by_id, getattr(obj, "proposal_version", "?"))

    def _version_link(self, summary_id: int | None, version: Any) -> str:
        if summary_id is None:
            return str(self.get_empty_value_display())
        url = reverse("admin:ctxsum_summary_change", args=[summary_id])
        return format_html('<a href="{}">v{}</a>', url, version)


# The facts on the core's review pages.
panels.register()
