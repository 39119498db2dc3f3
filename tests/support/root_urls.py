"""ctxsum mounted at the root, before the project's other routes."""

from django.contrib import admin
from django.urls import include, path

from tests.support.new_project_urls import own

urlpatterns = [
    path("", include("ctxsum.api.urls")),
    path("own/", own),
    path("admin/", admin.site.urls),
]
