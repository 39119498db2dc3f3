"""What the model admins share: read-only registration for the rows only services write,
the admin's own 403 page for a refused page or action, and the generic admin classes,
subscripted for mypy only."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import wraps
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.timezone import localtime
from django.utils.translation import gettext
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


# What Django's own admin views were refused, when their PermissionDenied says nothing.
REFUSALS = {
    "view": _("You may not view these %(names)s."),
    "add": _("You may not add %(names)s in the admin."),
    "change": _("You may not change %(names)s."),
    "delete": _("You may not delete %(names)s."),
}


def refused(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    refusal: PermissionDenied,
    object_id: str | None = None,
) -> TemplateResponse:
    """The admin's own page, status 403, for a refused page or action: what was refused
    (the refusal's text), and a link back to the object's review or change page if the user
    may view it, else the list, else the admin's home; in place of Django's bare 403."""
    opts = model_admin.opts
    obj = model_admin.get_object(request, object_id) if object_id else None
    if obj is not None and model_admin.has_view_permission(request, obj):
        back = _object_page(model_admin, obj)
        back_label = gettext("Back to “%(name)s”") % {"name": Truncator(str(obj)).chars(60)}
    elif model_admin.has_view_permission(request):
        back = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        back_label = gettext("Back to the %(names)s") % _names(model_admin)
    else:
        back, back_label = reverse("admin:index"), gettext("Back to the admin's home")
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": opts,
        "title": gettext("Permission denied"),
        "reason": str(refusal) or gettext("You do not have permission for this page."),
        "back": back,
        "back_label": back_label,
    }
    return TemplateResponse(request, "ctxsum/admin/forbidden.html", context, status=403)


def _names(model_admin: admin.ModelAdmin[Any]) -> dict[str, str]:
    return {"names": str(model_admin.opts.verbose_name_plural)}


def _object_page(model_admin: admin.ModelAdmin[Any], obj: Any) -> str:
    """The object's review page where its admin has one (a conversation), else its change
    page (a summary's is its review page)."""
    opts = model_admin.opts
    try:
        return reverse(f"admin:{opts.app_label}_{opts.model_name}_review", args=[obj.pk])
    except NoReverseMatch:
        return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])


def refusing(page: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A review page (``page(model_admin, request, object_id, ...)``) whose PermissionDenied
    answers with ``refused``'s page rather than Django's bare 403."""

    @wraps(page)
    def view(
        model_admin: admin.ModelAdmin[Any],
        request: HttpRequest,
        object_id: str,
        *args: Any,
        **kwargs: Any,
    ) -> HttpResponse:
        try:
            return page(model_admin, request, object_id, *args, **kwargs)
        except PermissionDenied as refusal:
            return refused(model_admin, request, refusal, object_id)

    return view


class RefusalMixin:
    """Django's own admin pages of a model (list, add, change, delete, history) refused on
    the admin's own 403 page (``refused``), which says what was refused and links back."""

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        view = super().changelist_view  # type: ignore[misc]
        return self._refusing("view", None, view, request, *args, **kwargs)

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        action = "add" if object_id is None else "change" if request.method == "POST" else "view"
        view = super().changeform_view  # type: ignore[misc]
        return self._refusing(action, object_id, view, request, object_id, *args, **kwargs)

    def delete_view(
        self, request: HttpRequest, object_id: str, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        view = super().delete_view  # type: ignore[misc]
        return self._refusing("delete", object_id, view, request, object_id, *args, **kwargs)

    def history_view(
        self, request: HttpRequest, object_id: str, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        view = super().history_view  # type: ignore[misc]
        return self._refusing("view", object_id, view, request, object_id, *args, **kwargs)

    def _refusing(
        self,
        action: str,
        object_id: str | None,
        view: Callable[..., HttpResponse],
        request: HttpRequest,
        *args: Any,
        **kwargs: Any,
    ) -> HttpResponse:
        model_admin: admin.ModelAdmin[Any] = self  # type: ignore[assignment]
        try:
            return view(request, *args, **kwargs)
        except PermissionDenied as refusal:
            if not str(refusal):
                refusal = PermissionDenied(REFUSALS[action] % _names(model_admin))
            return refused(model_admin, request, refusal, object_id)


class ConversationRowMixin(RefusalMixin, ReviewMediaMixin):
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
