"""Set up a demo: a user with a fresh password and an API token, the sample conversation,
and the real conversations of the data folder when it is there. Safe to run again: the
user, token and conversations are reused, only the password is new each time."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ctxsum.exceptions import TooLarge
from ctxsum.models import Conversation
from ctxsum.services import (
    RecordInvalid,
    error_reason,
    record_import,
    record_parse,
)


def _base_dir() -> Path:
    # The example project's root (settings.BASE_DIR); the checkout when a project has none.
    return Path(getattr(settings, "BASE_DIR", Path(__file__).resolve().parents[3]))


def default_sample() -> Path:
    return _base_dir() / "project" / "sample_conversation.json"


def default_data_dir() -> Path:
    """``../shared/data`` beside the project: the real conversations, where present."""
    return _base_dir().parent / "shared" / "data"


class Command(BaseCommand):
    help = (
        "Create (or reuse) a demo user with a fresh password and an API token, load the "
        "sample conversation and import the *.jsonl.gz files of the data folder for it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="demo", help="the demo user (default: demo)")
        parser.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            help="folder whose *.jsonl.gz files are imported (default: ../shared/data beside "
            "the project; skipped when it does not exist)",
        )
        parser.add_argument(
            "--sample",
            type=Path,
            default=None,
            help="the sample conversation, one JSON object in the import format "
            "(default: project/sample_conversation.json)",
        )
        parser.add_argument(
            "--url",
            default="http://127.0.0.1:8000",
            help="where the server runs, for the printed examples",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        user, password = self._user(username)
        token = self._token(user)
        # Paths are converted here too: call_command() passes keyword options unparsed.
        data_dir = Path(options["data_dir"] or default_data_dir())
        self._data(username, data_dir, options["verbosity"])
        # The sample goes last, so a first run puts it on top of the newest-first list.
        sample = self._sample(user, Path(options["sample"] or default_sample()))
        self._examples(options["url"].rstrip("/"), username, password, token, sample)

    def _user(self, username: str) -> tuple[Any, str]:
        User = get_user_model()
        manager = User._default_manager
        password = secrets.token_urlsafe(12)
        try:
            user = manager.get_by_natural_key(username)
        except User.DoesNotExist:
            # A new demo user may use the admin, to review summaries there.
            user = manager.create_superuser(
                **{User.USERNAME_FIELD: username}, email="", password=password
            )
            self.stdout.write(f"Created the demo user {username!r} (staff: can use /admin/).")
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
            admin = " (staff: can use /admin/)" if user.is_staff else ""
            self.stdout.write(f"Reusing the demo user {username!r}{admin}; new password set.")
        self.stdout.write(f"  username: {username}")
        self.stdout.write(f"  password: {password}")
        return user, password

    def _token(self, user: Any) -> str | None:
        if not apps.is_installed("rest_framework.authtoken"):
            self.stdout.write(
                '  API token: none ("rest_framework.authtoken" is not in INSTALLED_APPS)'
            )
            return None
        from rest_framework.authtoken.models import Token

        token, created = Token.objects.get_or_create(user=user)
        self.stdout.write(f"  API token: {token.key}{'' if created else ' (existing)'}")
        return str(token.key)

    def _sample(self, user: Any, path: Path) -> Conversation | None:
        if not path.is_file():
            self.stdout.write(f"No sample conversation at {path}; skipped.")
            return None
        try:
            record = record_parse(path.read_bytes())
        except RecordInvalid as error:
            raise CommandError(f"{path}: {error}") from error
        existing = Conversation.objects.filter(owner=user, metadata__source_id=record["id"]).first()
        if existing is not None:
            self.stdout.write(f"Sample conversation already loaded: {existing.pk}")
            return existing
        try:
            conversation = record_import(owner=user, record=record)
        except (ValidationError, TooLarge) as error:
            raise CommandError(f"{path}: {error_reason(error)}") from error
        self.stdout.write(
            f"Loaded the sample conversation {conversation.title!r} "
            f"({conversation.message_count} messages): {conversation.pk}"
        )
        return conversation

    def _data(self, username: str, data_dir: Path, verbosity: int) -> None:
        files = sorted(data_dir.glob("*.jsonl.gz")) if data_dir.is_dir() else []
        if not files:
            self.stdout.write(f"No *.jsonl.gz files in {data_dir}; no real conversations loaded.")
            return
        self.stdout.write(f"Importing {len(files)} file(s) from {data_dir} …")
        call_command(
            "ctxsum_import",
            *map(str, files),
            user=username,
            verbosity=verbosity,
            stdout=self.stdout._out,
            stderr=self.stderr._out,
        )

    def _examples(
        self,
        url: str,
        username: str,
        password: str,
        token: str | None,
        sample: Conversation | None,
    ) -> None:
        auth = '-H "Authorization: Token $TOKEN"'
        post = f'{auth} -H "Content-Type: application/json" -X POST'
        api = f"{url}/api/conversations"
        lines = [
            "",
            f"With the server running (make run starts it), open {url}/ and log in to",
            f"{url}/admin/ or {url}/api-auth/login/ as {username} / {password}",
        ]
        if token:
            lines += [
                "",
                "Try the API:",
                f"  export TOKEN={token}",
                f"  export CONV={sample.pk if sample else 'CONVERSATION_ID'}",
                f"  curl {auth} {api}/",
                f"  curl {auth} {api}/$CONV/",
                f"  curl {auth} {api}/$CONV/messages/",
                f"  curl {auth} {api}/$CONV/context/",
                f'  curl {post} {api}/$CONV/compact/ -d \'{{"force": true, "dry_run": true}}\'',
                f"  curl {post} {api}/$CONV/compact/ -d '{{\"force\": true}}'",
                f"  curl {auth} {api}/$CONV/summaries/",
                f"  curl {post} {api}/$CONV/messages/"
                ' -d \'{"role": "user", "content": "Can I take a 23 kg bag?"}\'',
                f"  curl {post} {api}/"
                ' -d \'{"title": "New chat", "system": "You are terse.",'
                ' "messages": [{"role": "user", "content": "Hello"}]}\'',
            ]
        for line in lines:
            self.stdout.write(line)
