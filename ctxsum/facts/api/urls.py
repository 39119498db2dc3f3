"""The facts' REST routes, joined to the core's under its ``ctxsum`` namespace
(``FactsConfig.ctxsum_api_urls``): a conversation's facts and a subject's."""

from django.urls import path, register_converter

from ctxsum.facts.api import views
from ctxsum.facts.api.paths import FactId

register_converter(FactId, "ctxsum_fact")

CONVERSATION = "conversations/<ctxsum_id:pk>/"
SUBJECT = "subjects/<ctxsum_subject:subject>/"

urlpatterns = [
    path(f"{CONVERSATION}facts/", views.ConversationFactList.as_view(), name="fact-list"),
    path(
        f"{CONVERSATION}facts/<ctxsum_fact:fact_id>/",
        views.ConversationFactDetail.as_view(),
        name="fact-detail",
    ),
    path(f"{SUBJECT}facts/", views.SubjectFactList.as_view(), name="subject-fact-list"),
    path(
        f"{SUBJECT}facts/<ctxsum_fact:fact_id>/",
        views.SubjectFactDetail.as_view(),
        name="subject-fact-detail",
    ),
]
