"""Errors as JSON: every answer of the API that is not a success carries ``detail`` (what
went wrong, for people) and ``code`` (stable, for programs); a 400's field errors are listed
under ``errors``, each with the field it is about, its own code and its words.

A URL under ctxsum's own routes (``conversations/…``, ``subjects/…``) that none of them
answers is a JSON 404 in any project (``unanswered``, the last of ``ctxsum.api.urls``).
``bad_request``, ``page_not_found`` and ``server_error`` are handlers a project can install
too (``handler400``/``handler404``/``handler500`` in its root URLconf): under the API's
prefix, wherever it is mounted, they answer JSON for the rest (another URL under the prefix,
a failure in middleware); elsewhere they answer Django's own pages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.urls import NoReverseMatch, is_valid_path, re_path, reverse
from django.urls.resolvers import URLPattern
from django.utils.translation import gettext_lazy as _
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.settings import api_settings

SERVER_ERROR = _("A server error occurred; it has been logged.")
NOT_FOUND = _("Not found.")
BAD_REQUEST = _("Bad request.")
SLASH_MISSING = _("Not found. Did you mean {path} (with the trailing slash)?")
# The first field error, and how many more there are.
MORE_ERRORS = _("{first} (and {count} more)")


class ServerError(exceptions.APIException):
    """What the client sees of an unexpected exception (the traceback goes to the log)."""

    status_code = status.HTTP_500_INTERNAL_SERVER_ERROR
    default_detail = SERVER_ERROR
    default_code = "server_error"


def error_body(detail: Any, code: str) -> dict[str, str]:
    return {"detail": str(detail), "code": code}


def invalid_body(detail: Any) -> dict[str, Any]:
    """A ValidationError's ``detail`` (DRF's tree of messages by field) as the API answers
    it: ``{"detail", "code": "invalid", "errors": [{"field", "code", "detail"}, …]}``, the
    first error in words as ``detail``."""
    errors = list(field_errors(detail))
    first = errors[0] if errors else {"field": None, "detail": str(BAD_REQUEST)}
    words = f"{first['field']}: {first['detail']}" if first["field"] else first["detail"]
    if len(errors) > 1:
        words = MORE_ERRORS.format(first=words, count=len(errors) - 1)
    return {**error_body(words, "invalid"), "errors": errors}


def field_errors(detail: Any, field: str | None = None) -> Iterator[dict[str, Any]]:
    """Each message of ``detail`` as ``{"field", "code", "detail"}``: ``field`` is the path
    to it, dotted (``policy.trigger``, ``messages.1.role``), or null for the request as a
    whole; ``code`` is the message's (DRF's ``ErrorDetail.code``), ``invalid`` without."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            inner = None if key == api_settings.NON_FIELD_ERRORS_KEY else str(key)
            yield from field_errors(value, _joined(field, inner))
    elif isinstance(detail, list):
        # Messages about one field, or one entry per item of a list (a batch's messages,
        # each an object of its own errors, empty when it is valid).
        for index, item in enumerate(detail):
            if isinstance(item, dict | list):
                yield from field_errors(item, _joined(field, str(index)))
            else:
                yield from field_errors(item, field)
    else:
        code = getattr(detail, "code", None) or "invalid"
        yield {"field": field, "code": str(code), "detail": str(detail)}


def _joined(field: str | None, step: str | None) -> str | None:
    if step is None:
        return field
    return step if field is None else f"{field}.{step}"


def _under_api(request: HttpRequest) -> bool:
    try:
        root = reverse("ctxsum:api-root")
    except NoReverseMatch:
        return False
    return request.path.startswith(root)


def _handler(default: Callable[..., HttpResponse], detail: Any, code: str, status: int) -> Any:
    """A handler for the root URLconf: JSON under the API's prefix, ``default`` elsewhere
    (Django has logged a server error with its traceback, logger django.request)."""

    def handler(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if _under_api(request):
            return JsonResponse(error_body(detail, code), status=status)
        return default(request, *args, **kwargs)

    return handler


bad_request = _handler(defaults.bad_request, BAD_REQUEST, "bad_request", 400)
page_not_found = _handler(defaults.page_not_found, NOT_FOUND, "not_found", 404)
server_error = _handler(defaults.server_error, SERVER_ERROR, "server_error", 500)


@csrf_exempt  # it changes nothing: a POST without its CSRF token is a 404 too, not an HTML 403
def unanswered(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """A JSON 404 for a URL under ctxsum's routes that none of them answers. A URL that
    lacks only its trailing slash (with ``APPEND_SLASH``) is redirected, as Django's
    CommonMiddleware would, for GET and HEAD; any other method is a 404 that names the URL
    to use (Django cannot redirect it without losing the body)."""
    if _answered_with_slash(request):
        if request.method in ("GET", "HEAD"):
            return HttpResponsePermanentRedirect(request.get_full_path(force_append_slash=True))
        detail = SLASH_MISSING.format(path=f"{request.path}/")
        return JsonResponse(error_body(detail, "not_found"), status=404)
    return JsonResponse(error_body(NOT_FOUND, "not_found"), status=404)


def _answered_with_slash(request: HttpRequest) -> bool:
    """Whether a route answers the URL with a trailing slash added, under APPEND_SLASH."""
    if not settings.APPEND_SLASH or request.path_info.endswith("/"):
        return False
    match = is_valid_path(f"{request.path_info}/", getattr(request, "urlconf", None))
    if not match or match.func is unanswered:
        return False
    return bool(getattr(match.func, "should_append_slash", True))


def unanswered_route() -> URLPattern:
    """The last of ctxsum's routes: ``unanswered`` for any other URL under its own
    resources. It never takes a URL outside them, so it swallows no route of the project,
    even with ctxsum mounted at the root or before other routes under the same prefix."""
    return re_path(r"^(?:conversations|subjects)(?:/.*)?$", unanswered)
