"""Every write and every transaction of ctxsum: the Python API. Views, the admin and
commands call these, importing from this package, never from its modules; so can your code.

The first group is the API docs/guide/python-api.md documents for your code; the second is what the
REST layer, the admin and the commands also need (requests' Idempotency-Keys, the checks
behind the edit form, imports with progress, the background compaction's entry point).
The chat turn's writes are the ``ctxsum.chat`` app's own (``ctxsum.chat.services``).
"""

from ctxsum.services.autocompact import compaction_queued_at, conversation_compact_queued
from ctxsum.services.compaction import aconversation_compact, conversation_compact
from ctxsum.services.conversations import (
    MAX_SUBJECT_CHARS,
    POLICY_FIELDS,
    aconversation_restart,
    conversation_create,
    conversation_delete,
    conversation_restart,
    conversation_update,
    fields_clean,
    policy_clean,
    subject_problem,
)
from ctxsum.services.idempotency import (
    Answer,
    Claim,
    Found,
    fingerprint,
    key_answer,
    key_claim,
    key_release,
    keys_expired_delete,
)
from ctxsum.services.imports import (
    REASONS_SHOWN,
    RecordInvalid,
    Tally,
    error_reason,
    file_import,
    imported_source_ids,
    record_import,
    record_parse,
)
from ctxsum.services.messages import amessage_append, message_append
from ctxsum.services.pop import amessage_pop, message_pop
from ctxsum.services.rebuild import conversation_rebuild
from ctxsum.services.redaction import WITHHELD, message_redact
from ctxsum.services.revert import conversation_revert
from ctxsum.services.row_lease import LeaseLost
from ctxsum.services.transactions import write_db

__all__ = [
    "aconversation_compact",
    "aconversation_restart",
    "amessage_append",
    "amessage_pop",
    "conversation_compact",
    "conversation_compact_queued",
    "conversation_create",
    "conversation_delete",
    "conversation_rebuild",
    "conversation_restart",
    "conversation_revert",
    "conversation_update",
    "file_import",
    "keys_expired_delete",
    "message_append",
    "message_pop",
    "message_redact",
    "write_db",
]
__all__ += [
    "MAX_SUBJECT_CHARS",
    "POLICY_FIELDS",
    "REASONS_SHOWN",
    "WITHHELD",
    "Answer",
    "Claim",
    "Found",
    "LeaseLost",
    "RecordInvalid",
    "Tally",
    "compaction_queued_at",
    "error_reason",
    "fields_clean",
    "fingerprint",
    "imported_source_ids",
    "key_answer",
    "key_claim",
    "key_release",
    "policy_clean",
    "record_import",
    "record_parse",
    "subject_problem",
]
