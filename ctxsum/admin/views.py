"""The review pages: a conversation (its active context as a chat, its transcript a page at
a time with archived messages under the summary version that archived them), a summary (its
text beside the messages it covers, the word diff from the previous version, lineage,
prompt, coverage), and the confirmations of a redaction and of undoing a compaction. The
conversation's and the summary's pages show the panels installed apps add
(``ctxsum.hooks.Panel``: the key facts of ``ctxsum.facts``). Each takes a fixed number of
queries however long the conversation is; every write goes through a service."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext

from ctxsum import services
from ctxsum.admin import queries
from ctxsum.admin.base import refusing
from ctxsum.admin.rendering import (
    message_views,
    stale_reasons,
    transcript_groups,
    word_diff,
)
from ctxsum.conf import ctxsum_settings
from ctxsum.hooks import CONVERSATION_PAGE, SUMMARY_PAGE, review_panels
from ctxsum.models import Conversation, Message, Summary
from ctxsum.selectors import conversation_effective_policy, conversation_policy, prompt_sha256

M = TypeVar("M", bound=Model)


def viewable(model_admin: admin.ModelAdmin[M], request: HttpRequest, object_id: str) -> M:
    """The object the URL names, if this user may view it; else 404 or 403."""
    obj = model_admin.get_object(request, object_id)
    if obj is None:
        raise Http404(gettext("No such %s.") % model_admin.opts.verbose_name)
    if not model_admin.has_view_permission(request, obj):
        names = model_admin.opts.verbose_name_plural
        raise PermissionDenied(gettext("You may not view %(names)s.") % {"names": names})
    return obj


def may_view(model_admin: admin.ModelAdmin[Any], request: HttpRequest, model: type[Model]) -> bool:
    """Whether the user may open ``model``'s admin pages (to link them or not)."""
    site = model_admin.admin_site
    return site.is_registered(model) and site.get_model_admin(model).has_view_permission(request)


def may_revert(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, conversation: Conversation
) -> bool:
    """Undoing a compaction changes the conversation: its admin's change permission."""
    site = model_admin.admin_site
    if not site.is_registered(Conversation):
        return False
    return site.get_model_admin(Conversation).has_change_permission(request, conversation)


def may_redact(request: HttpRequest) -> bool:
    """Redacting changes a message: Django's ``change_message`` permission (the admin has no
    other way to change one)."""
    return request.user.has_perm("ctxsum.change_message")


def _page(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, title: str, **context: Any
) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": title,
        "can_view_conversations": may_view(model_admin, request, Conversation),
        "can_view_summaries": may_view(model_admin, request, Summary),
        "can_view_messages": may_view(model_admin, request, Message),
        **context,
    }


@refusing
def conversation_review(
    model_admin: admin.ModelAdmin[Conversation], request: HttpRequest, object_id: str
) -> HttpResponse:
    conversation = viewable(model_admin, request, object_id)
    preview = queries.context_preview(conversation)
    page = queries.transcript_page(conversation, request.GET.get("page"))
    policy = conversation_effective_policy(conversation)
    last_attempt = getattr(conversation, "last_attempt_at", None)  # annotated like a list row
    context = _page(
        model_admin,
        request,
        gettext("Review conversation"),
        subtitle=str(conversation),
        conversation=conversation,
        queued_at=services.compaction_queued_at(conversation, last_attempt),
        ceiling=conversation_policy(conversation).max_context_tokens,
        policy={name: json.dumps(value) for name, value in policy.items()},
        default_model=ctxsum_settings.DEFAULT_MODEL,
        leading=message_views([preview.leading]) if preview.leading else [],
        summary=preview.summary,
        summary_stale=bool(preview.summary and stale_reasons(preview.summary)),
        recent=message_views(preview.recent),
        hidden=preview.hidden,
        page=page,
        groups=transcript_groups(message_views(page.messages)),
        summaries=queries.recent_summaries(conversation),
        attempts=queries.recent_attempts(conversation),
        panels=review_panels(CONVERSATION_PAGE, request, model_admin, conversation),
        can_change=model_admin.has_change_permission(request, conversation),
        can_redact=may_redact(request),
    )
    return TemplateResponse(request, "ctxsum/admin/conversation_review.html", context)


@refusing
def summary_review(
    model_admin: admin.ModelAdmin[Summary], request: HttpRequest, object_id: str
) -> HttpResponse:
    summary = viewable(model_admin, request, object_id)
    previous = summary.previous
    page = queries.covered_page(summary, request.GET.get("page"))
    facts = summary.coverage_facts or []
    context = _page(
        model_admin,
        request,
        gettext("Review summary"),
        subtitle=f"v{summary.version} · {summary.conversation}",
        summary=summary,
        conversation=summary.conversation,
        previous=previous,
        following=summary.next.first(),
        diff=word_diff(previous.text, summary.text) if previous else None,
        stale_reasons=stale_reasons(summary),
        current_prompt_version=ctxsum_settings.PROMPT_VERSION,
        current_prompt_sha256=prompt_sha256(ctxsum_settings.PROMPT),
        present=[fact for fact in facts if fact.get("present")],
        missing=[fact for fact in facts if not fact.get("present")],
        page=page,
        covered=message_views(page.messages, archived_by=summary),
        panels=review_panels(SUMMARY_PAGE, request, model_admin, summary),
        can_revert=summary.active and may_revert(model_admin, request, summary.conversation),
    )
    return TemplateResponse(request, "ctxsum/admin/summary_review.html", context)


@refusing
def message_redact(
    model_admin: admin.ModelAdmin[Conversation], request: HttpRequest, object_id: str, seq: int
) -> HttpResponse:
    """GET: what redacting the message would do; POST (with the CSRF token the admin
    checks): redact it through ``services.message_redact``."""
    conversation = viewable(model_admin, request, object_id)
    if not may_redact(request):
        raise PermissionDenied(
            gettext("Redacting a message needs the permission to change messages.")
        )
    message = get_object_or_404(Message, conversation=conversation, seq=seq)
    review = reverse("admin:ctxsum_conversation_review", args=[conversation.pk])
    back = f"{review}?page={queries.page_of(seq)}#m{seq}"
    if request.method == "POST":
        services.message_redact(conversation=conversation, seq=seq)
        model_admin.log_change(request, conversation, f"Redacted message {seq}.")
        text = gettext(
            "Message %(seq)d was redacted; the summaries covering it are withheld until rebuilt."
        )
        model_admin.message_user(request, text % {"seq": seq}, messages.SUCCESS)
        return HttpResponseRedirect(back)
    context = _page(
        model_admin,
        request,
        gettext("Redact message %(seq)d") % {"seq": seq},
        subtitle=str(conversation),
        conversation=conversation,
        message=message_views([message])[0],
        covering=list(conversation.summaries.filter(from_seq__lte=seq, to_seq__gte=seq)),
        back=back,
    )
    return TemplateResponse(request, "ctxsum/admin/message_redact.html", context)


@refusing
def summary_revert(
    model_admin: admin.ModelAdmin[Conversation],
    request: HttpRequest,
    object_id: str,
    version: int,
) -> HttpResponse:
    """GET: what undoing the compaction that wrote ``version`` would do; POST (with the CSRF
    token the admin checks): revert it through ``services.conversation_revert``."""
    conversation = viewable(model_admin, request, object_id)
    if not model_admin.has_change_permission(request, conversation):
        raise PermissionDenied(
            gettext("Undoing a compaction needs the permission to change conversations.")
        )
    summary = get_object_or_404(
        Summary.objects.select_related("previous"), conversation=conversation, version=version
    )
    back = reverse("admin:ctxsum_summary_change", args=[summary.pk])
    if request.method == "POST":
        return _revert(model_admin, request, conversation, summary, back)
    count, tokens = queries.archived_by(summary)
    previous = summary.previous
    after = conversation.context_tokens + tokens - summary.token_count
    context = _page(
        model_admin,
        request,
        gettext("Undo the compaction that wrote v%(version)d") % {"version": version},
        subtitle=str(conversation),
        conversation=conversation,
        summary=summary,
        previous=previous,
        restored_count=count,
        tokens_before=conversation.context_tokens,
        tokens_after=after + (previous.token_count if previous else 0),
        back=back,
    )
    return TemplateResponse(request, "ctxsum/admin/summary_revert.html", context)


def _revert(
    model_admin: admin.ModelAdmin[Conversation],
    request: HttpRequest,
    conversation: Conversation,
    summary: Summary,
    back: str,
) -> HttpResponse:
    try:
        result = services.conversation_revert(conversation=conversation, version=summary.version)
    except ValidationError as error:  # not the active summary (any more)
        model_admin.message_user(request, " ".join(error.messages), messages.ERROR)
        return HttpResponseRedirect(back)
    if not result.reverted:
        text = gettext(
            "Nothing was reverted (%(reason)s): another worker is summarizing this "
            "conversation, or its active summary changed meanwhile. Try again."
        )
        model_admin.message_user(request, text % {"reason": result.reason}, messages.WARNING)
        return HttpResponseRedirect(back)
    model_admin.log_change(request, conversation, f"Reverted summary v{summary.version}.")
    text = gettext(
        "v%(version)d was reverted: %(count)d messages are active again, and %(active)s."
    )
    active = (
        gettext("v%(version)d is the active summary") % {"version": result.summary.version}
        if result.summary
        else gettext("the conversation has no summary")
    )
    values = {"version": summary.version, "count": len(result.restored), "active": active}
    model_admin.message_user(request, text % values, messages.SUCCESS)
    return HttpResponseRedirect(reverse("admin:ctxsum_conversation_review", args=[conversation.pk]))
