"""Delete the Idempotency-Keys older than IDEMPOTENCY_KEY_SECONDS (like clearsessions)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ctxsum.services import keys_expired_delete


class Command(BaseCommand):
    help = "Delete expired Idempotency-Keys and their stored answers; run it on a schedule."

    def handle(self, *args: Any, **options: Any) -> None:
        deleted = keys_expired_delete()
        self.stdout.write(f"Deleted {deleted} expired idempotency key(s).")
