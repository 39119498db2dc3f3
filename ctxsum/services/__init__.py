"""Every write and every transaction of ctxsum. Views, the admin and commands call these."""

from ctxsum.services.conversations import (
    conversation_create,
    conversation_delete,
    conversation_update,
)
from ctxsum.services.messages import message_append

__all__ = [
    "conversation_create",
    "conversation_delete",
    "conversation_update",
    "message_append",
]
