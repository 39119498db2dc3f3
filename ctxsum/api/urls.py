"""The REST API's routes: the core's, then those of each installed app that names a module of
routes as ``ctxsum_api_urls`` on its AppConfig (``ctxsum.facts``, ``ctxsum.chat``). Its
``urlpatterns`` join these under the ``ctxsum`` namespace, so they reverse as the core's do."""

from importlib import import_module

from django.apps import apps
from django.urls import path, register_converter

from ctxsum.api import paths, views

app_name = "ctxsum"

for name, converter in paths.CONVERTERS.items():
    register_converter(converter, name)

CONVERSATION = "conversations/<ctxsum_id:pk>/"

urlpatterns = [
    path("", views.ApiRoot.as_view(), name="api-root"),
    path("conversations/", views.ConversationList.as_view(), name="conversation-list"),
    path(CONVERSATION, views.ConversationDetail.as_view(), name="conversation-detail"),
    path(f"{CONVERSATION}messages/", views.MessageList.as_view(), name="message-list"),
    path(
        f"{CONVERSATION}messages/<ctxsum_seq:seq>/redact/",
        views.MessageRedact.as_view(),
        name="message-redact",
    ),
    path(f"{CONVERSATION}context/", views.ContextDetail.as_view(), name="context"),
    path(f"{CONVERSATION}compact/", views.ConversationCompact.as_view(), name="compact"),
    path(f"{CONVERSATION}summaries/", views.SummaryList.as_view(), name="summary-list"),
    path(
        f"{CONVERSATION}summaries/rebuild/", views.SummaryRebuild.as_view(), name="summary-rebuild"
    ),
    path(
        f"{CONVERSATION}summaries/<ctxsum_version:version>/revert/",
        views.SummaryRevert.as_view(),
        name="summary-revert",
    ),
]

for config in apps.get_app_configs():
    if module := getattr(config, "ctxsum_api_urls", None):
        urlpatterns += import_module(module).urlpatterns
