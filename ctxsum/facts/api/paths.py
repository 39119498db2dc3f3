"""The fact id segment of the facts' paths: its converter (``ctxsum_fact``, registered by
``urls``), which states its form, and its reader in the views."""

from __future__ import annotations

from ctxsum.api.base import from_path
from ctxsum.api.paths import Number
from ctxsum.facts.api.errors import FACT_NOT_FOUND


class FactId(Number):
    canonical, limit = "[1-9][0-9]{0,18}", 2**63 - 1
    description = "The fact's id: 1, 2, 3, … in decimal."


fact_id_from_path = from_path(FactId.parse, FACT_NOT_FOUND)
