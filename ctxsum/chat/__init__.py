"""ctxsum.chat: the chat turn, an optional app. One model call on a conversation's active
context, stored with the message it answers (``ctxsum.chat.services.chat_turn``, the REST
route ``…/chat/``). Add ``"ctxsum.chat"`` to ``INSTALLED_APPS`` after ``"ctxsum"``."""
