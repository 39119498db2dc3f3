"""The REST API's routes: the core's, then those of each installed app that names a module of
routes as ``ctxsum_api_urls`` on its AppConfig (``ctxsum.facts``, ``ctxsum.chat``). Its
``urlpatterns`` join these under the ``ctxsum`` namespace, so they reverse as the core's do."""

from importlib import import_module

from django.apps import apps
from django.urls import path, register_converter

from ctxsum.api import errors, paths, views

app_name = "ctxsum"

for name, converter in paths.CONVERTERS.items():
    register_converter(converter, name)

CONVERSATION = "conversations/<ctxsum_id:pk>/"

# The routes about one conversation, under CONVERSATION.
ON_CONVERSATION = [
    ("", views.ConversationDetail, "conversation-detail"),
    ("messages/", views.MessageList, "message-list"),
    ("messages/<ctxsum_seq:seq>/redact/", views.MessageRedact, "message-redact"),
    ("context/", views.ContextDetail, "context"),
    ("compact/", views.ConversationCompact, "compact"),
    ("summaries/", views.SummaryList, "summary-list"),
    ("summaries/rebuild/", views.SummaryRebuild, "summary-rebuild"),
    ("summaries/<ctxsum_version:version>/revert/", views.SummaryRevert, "summary-revert"),
]

urlpatterns = [
    path("", views.ApiRoot.as_view(), name="api-root"),
    path("conversations/", views.ConversationList.as_view(), name="conversation-list"),
    *(
        path(CONVERSATION + route, view.as_view(), name=name)
        for route, view, name in ON_CONVERSATION
    ),
]

for config in apps.get_app_configs():
    if module := getattr(config, "ctxsum_api_urls", None):
        urlpatterns += import_module(module).urlpatterns

# Last: a JSON 404 for any other URL under the routes above (ctxsum.api.errors).
urlpatterns.append(errors.unanswered_route())
