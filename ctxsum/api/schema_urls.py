"""The API's OpenAPI document and its docs page (Swagger UI), for a project to mount where
it mounts ctxsum's routes::

    path("api/", include("ctxsum.api.schema_urls")),  # /api/schema/ and /api/docs/
    path("api/", include("ctxsum.api.urls")),

Named ``schema`` and ``api-docs`` (no namespace). The document covers every route of the
project that drf-spectacular can describe, ctxsum's with their own descriptions
(``ctxsum/api/schema.py``); its settings are drf-spectacular's (docs/how-to/install.md, "The
API schema and its docs page").
"""

from __future__ import annotations

from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]
