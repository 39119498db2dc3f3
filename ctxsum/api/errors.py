"""Errors as JSON: every answer of the API that is not a success carries ``detail`` (what
went wrong, for people) and ``code`` (stable, for programs); field errors of a 400 name each
field instead.

``bad_request``, ``page_not_found`` and ``server_error`` are handlers a project can install
(``handler400``/``handler404``/``handler500`` in its root URLconf): under the API's prefix,
wherever it is mounted, they answer JSON for what no view answered (an unknown URL, a
failure in middleware); elsewhere they answer Django's own pages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext_lazy as _
from django.views import defaults
from rest_framework import exceptions, status

SERVER_ERROR = _("A server error occurred; it has been logged.")
NOT_FOUND = _("Not found.")
BAD_REQUEST = _("Bad request.")


class ServerError(exceptions.APIException):
    """What the client sees of an unexpected exception (the traceback goes to the log)."""

    status_code = status.HTTP_500_INTERNAL_SERVER_ERROR
    default_detail = SERVER_ERROR
    default_code = "server_error"


def error_body(detail: Any, code: str) -> dict[str, str]:
    return {"detail": str(detail), "code": code}


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
