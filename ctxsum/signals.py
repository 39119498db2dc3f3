"""Signals ctxsum sends; each goes out after the transaction that caused it commits."""

from django.dispatch import Signal

messages_appended = Signal()
"""Messages were stored.
``sender=Conversation``; ``conversation=``, ``messages=[Message, ...]``."""
summary_created = Signal()
"""A compaction wrote a summary. ``sender=Conversation``; ``conversation=``,
``summary=Summary``, ``attempt=CompactionAttempt``."""
compaction_failed = Signal()
"""A compaction failed. ``sender=Conversation``; ``conversation=``,
``attempt=CompactionAttempt``, ``error=`` the exception raised (not an ``Exception`` when the
worker was interrupted: ``KeyboardInterrupt``, ``SystemExit``, …)."""
summary_reverted = Signal()
"""A summary was reverted. ``sender=Conversation``; ``conversation=``, ``summary=`` the
reverted ``Summary``, ``restored=`` the ``Summary`` active again (None: none),
``attempt=CompactionAttempt``."""
