"""Every write and every transaction of ctxsum: the Python API. Views, the admin and
commands call these; so can your code."""

from ctxsum.services.chat import chat_turn
from ctxsum.services.compaction import conversation_compact
from ctxsum.services.conversations import (
    conversation_create,
    conversation_delete,
    conversation_update,
)
from ctxsum.services.facts import fact_add, fact_change, fact_delete
from ctxsum.services.imports import file_import
from ctxsum.services.messages import message_append
from ctxsum.services.rebuild import conversation_rebuild
from ctxsum.services.redaction import message_redact
from ctxsum.services.revert import conversation_revert

__all__ = [
    "chat_turn",
    "conversation_compact",
    "conversation_create",
    "conversation_delete",
    "conversation_rebuild",
    "conversation_revert",
    "conversation_update",
    "fact_add",
    "fact_change",
    "fact_delete",
    "file_import",
    "message_append",
    "message_redact",
]
