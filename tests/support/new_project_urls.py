"""URLconfs as a new project writes them: no error handlers of ctxsum's, routes of the
project's own under the prefix ctxsum is mounted at, or ctxsum mounted at the root."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path


def own(request: HttpRequest) -> JsonResponse:
    """A route of the project's own."""
    return JsonResponse({"own": request.path})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("ctxsum.api.urls")),
    # After ctxsum's routes, under the same prefix: still answered.
    path("api/", include("ctxsum.api.schema_urls")),
    path("api/own/", own),
]


def no_handler(exc: Exception, context: dict[str, object]) -> None:
    """A project's EXCEPTION_HANDLER that answers nothing (DRF would raise)."""
    return None
