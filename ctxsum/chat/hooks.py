"""How the chat turn joins the core's commits: a conversation's creation makes its chat
state in the same transaction, so its first turn finds the row there (one made before the
app was installed gets it from its first turn: ``turns._take``)."""

from __future__ import annotations

from typing import Any

from ctxsum.chat.models import ChatState
from ctxsum.hooks import CommitHook, ConversationChanged, Event
from ctxsum.models import Conversation

CHAT_STATE = "chat_state"


class ChatStateHook(CommitHook):
    """Creates a new conversation's ChatState once its row is saved."""

    def concerns(self, conversation: Conversation, event: Event, *, db: str) -> bool:
        return isinstance(event, ConversationChanged) and conversation._state.adding

    def apply(self, event: Event, *, locked: Conversation, held: Any) -> None:
        ChatState.objects.using(locked._state.db).create(conversation=locked)
