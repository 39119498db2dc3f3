"""Errors as JSON: every answer of the API that is not a success carries ``detail`` (what
went wrong, for people) and ``code`` (stable, for programs); field errors of a 400 name each
field instead.

``bad_request``, ``page_not_found`` and ``server_error`` are handlers a project can install
(``handler400``/``handler404``/``handler500`` in its root URLconf): under the API's prefix,
wherever it is mounted, they answer JSON for what no view answered (an unknown URL, a
failure in middleware); elsewhere they answer Django's own pages.
"""

from __future__ import annotations

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


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _under_api(request):
        return JsonResponse(error_body(BAD_REQUEST, "bad_request"), status=400)
    return defaults.bad_request(request, exception)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _under_api(request):
        return JsonResponse(error_body(NOT_FOUND, "not_found"), status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    # Django has logged the exception with its traceback (logger django.request).
    if _under_api(request):
        return JsonResponse(error_body(SERVER_ERROR, "server_error"), status=500)
    return defaults.server_error(request)
