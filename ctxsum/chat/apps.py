from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ChatConfig(AppConfig):
    name = "ctxsum.chat"
    label = "ctxsum_chat"
    verbose_name = _("Chat turns")
    default_auto_field = "django.db.models.BigAutoField"
    # The REST route of the chat turn, joined to the core's (ctxsum/api/urls.py).
    ctxsum_api_urls = "ctxsum.chat.urls"

    def ready(self) -> None:
        """Join the core: the chat state of each new conversation, the chat usage in its
        stats (and their schema, with the turn's 429), its errors in the API's answers, the
        CHAT_* settings' checks."""
        from ctxsum.api.exceptions import map_app_errors
        from ctxsum.chat import checks  # noqa: F401  (registers the system checks)
        from ctxsum.chat.api_exceptions import chat_exception
        from ctxsum.chat.hooks import CHAT_STATE, ChatStateHook
        from ctxsum.chat.schema import declare
        from ctxsum.chat.selectors import chat_usage
        from ctxsum.hooks import contribute_stats, register_commit_hook

        register_commit_hook(CHAT_STATE, ChatStateHook())
        contribute_stats("chat", lambda conversation: chat_usage(conversation=conversation))
        declare()
        map_app_errors(self.label, chat_exception)
