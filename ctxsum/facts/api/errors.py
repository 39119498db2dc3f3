"""A fact the request names that does not exist (or no longer does) answers 404."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions

from ctxsum.facts.models import Fact

FACT_NOT_FOUND = _("No such fact.")


def fact_errors(exc: Exception) -> Exception | None:
    """A fact deleted by another request between the lookup and the service's locked
    re-read: a 404, as if it had been gone at the lookup. None for any other error."""
    return exceptions.NotFound(FACT_NOT_FOUND) if isinstance(exc, Fact.DoesNotExist) else None
