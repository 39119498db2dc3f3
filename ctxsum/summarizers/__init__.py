"""Summarizer backends, chosen by dotted path like Django's CACHES or EMAIL_BACKEND.

``get_summarizer()`` returns the configured backend. Backends themselves live in ``base``,
``openai`` and ``offline``; this package imports none of the network ones.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from ctxsum.conf import ctxsum_settings
from ctxsum.summarizers.base import Summarizer

__all__ = ["Summarizer", "get_summarizer"]

_lock = threading.Lock()
_cached: tuple[tuple[Any, ...], Summarizer] | None = None


def get_summarizer() -> Summarizer:
    """The backend configured in ``CTXSUM``, reused while the settings it was built from
    stay the same (so the OpenAI client and its connection pool live for the process) and
    rebuilt when they change, e.g. under ``override_settings(CTXSUM=...)``."""
    global _cached
    backend = ctxsum_settings.SUMMARIZER
    given: dict[str, Any] = {
        "model": ctxsum_settings.SUMMARY_MODEL,
        "timeout": ctxsum_settings.SUMMARY_TIMEOUT,
        "max_tokens": ctxsum_settings.SUMMARY_MAX_TOKENS,
        "options": ctxsum_settings.SUMMARIZER_OPTIONS or {},
    }
    with _lock:
        if _cached is None or _cached[0] != (backend, given):
            # A deep copy, so a caller mutating the settings dict later cannot fake a match.
            _cached = ((backend, copy.deepcopy(given)), backend(**given))
        return _cached[1]
