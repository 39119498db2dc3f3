from django.urls import path

from ctxsum.api import chat, facts, views

app_name = "ctxsum"

urlpatterns = [
    path("", views.ApiRoot.as_view(), name="api-root"),
    path("conversations/", views.ConversationList.as_view(), name="conversation-list"),
    path("conversations/<str:pk>/", views.ConversationDetail.as_view(), name="conversation-detail"),
    path("conversations/<str:pk>/messages/", views.MessageList.as_view(), name="message-list"),
    path(
        "conversations/<str:pk>/messages/<str:seq>/redact/",
        views.MessageRedact.as_view(),
        name="message-redact",
    ),
    path("conversations/<str:pk>/context/", views.ContextDetail.as_view(), name="context"),
    path("conversations/<str:pk>/compact/", views.ConversationCompact.as_view(), name="compact"),
    path("conversations/<str:pk>/chat/", chat.ConversationChat.as_view(), name="chat"),
    path("conversations/<str:pk>/facts/", facts.ConversationFactList.as_view(), name="fact-list"),
    path(
        "conversations/<str:pk>/facts/<str:fact_id>/",
        facts.ConversationFactDetail.as_view(),
        name="fact-detail",
    ),
    path("conversations/<str:pk>/summaries/", views.SummaryList.as_view(), name="summary-list"),
    path(
        "conversations/<str:pk>/summaries/rebuild/",
        views.SummaryRebuild.as_view(),
        name="summary-rebuild",
    ),
    path(
        "conversations/<str:pk>/summaries/<str:version>/revert/",
        views.SummaryRevert.as_view(),
        name="summary-revert",
    ),
    path(
        "subjects/<str:subject>/facts/",
        facts.SubjectFactList.as_view(),
        name="subject-fact-list",
    ),
    path(
        "subjects/<str:subject>/facts/<str:fact_id>/",
        facts.SubjectFactDetail.as_view(),
        name="subject-fact-detail",
    ),
]
