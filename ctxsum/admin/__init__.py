"""The admin: a review workbench for conversations and their summaries.

Messages, summaries and attempts are read-only; a conversation is edited through
``conversation_update`` and deleted through ``conversation_delete``; every action calls a
service. Importing this package registers the model admins with the default site (the key
facts' admin is the ``ctxsum.facts`` app's own, the chat turns' the ``ctxsum.chat`` app's).
"""

from ctxsum.admin.attempts import CompactionAttemptAdmin
from ctxsum.admin.conversations import ConversationAdmin
from ctxsum.admin.messages import MessageAdmin
from ctxsum.admin.summaries import SummaryAdmin

__all__ = [
    "CompactionAttemptAdmin",
    "ConversationAdmin",
    "MessageAdmin",
    "SummaryAdmin",
]
