"""The chat turn's REST route, joined to the core's under the ``ctxsum`` namespace
(``ctxsum:chat``) through ``ChatConfig.ctxsum_api_urls``."""

from django.urls import path

from ctxsum.api.urls import CONVERSATION
from ctxsum.chat.views import ConversationChat, chat_view

urlpatterns = [
    path(f"{CONVERSATION}chat/", chat_view(ConversationChat.as_view()), name="chat"),
]
