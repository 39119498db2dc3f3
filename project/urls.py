from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView

from project import offline_model, views

urlpatterns = [
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    path("chat/", views.chat, name="chat"),
    path("admin/", admin.site.urls),
    path("api/", include("ctxsum.api.schema_urls")),  # /api/schema/, /api/docs/
    path("api/", include("ctxsum.api.urls")),
    path("api-auth/", include("rest_framework.urls")),
]
if settings.OFFLINE_CHAT_MODEL:
    urlpatterns.append(
        path("offline-model/v1/chat/completions", offline_model.chat_completions),
    )

# JSON for what no view answers under the API's prefix (an unknown URL, a failure outside
# a view); Django's own pages elsewhere.
handler400 = "ctxsum.api.errors.bad_request"
handler404 = "ctxsum.api.errors.page_not_found"
handler500 = "ctxsum.api.errors.server_error"
