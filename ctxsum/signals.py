"""Signals ctxsum sends; each goes out after the transaction that caused it commits."""

from django.dispatch import Signal

# sender=Conversation; conversation=, messages=[Message, ...]
messages_appended = Signal()
# sender=Conversation; conversation=, summary=Summary, attempt=CompactionAttempt
summary_created = Signal()
# sender=Conversation; conversation=, attempt=CompactionAttempt, error=the exception raised
# (not an Exception when the worker was interrupted: KeyboardInterrupt, SystemExit, …)
compaction_failed = Signal()
# sender=Conversation; conversation=, summary=the reverted Summary, restored=the Summary
# active again (None: none), attempt=CompactionAttempt
summary_reverted = Signal()
