"""The segments of the API's paths: a converter each (``ctxsum.api.urls`` registers them),
holding the canonical form of what it names, which the views read (``parse``) and the
OpenAPI document states. A converter matches any segment, as ``str`` does: a malformed one
reaches its view, which answers it as the row it cannot name (a JSON 404 saying what is
missing), after authentication, never as an unknown URL.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from ctxsum.services import subject_problem


class Segment:
    """A path segment, passed to the view as it came."""

    regex = "[^/]+"
    # What names something: a regular expression both Python and ECMA-262 read.
    canonical: ClassVar[str]
    description: ClassVar[str]

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: Any) -> str:
        return str(value)

    @classmethod
    def parse(cls, value: str) -> Any:
        """What ``value`` names, or None when it is not written as ``canonical``."""
        return value if re.fullmatch(cls.canonical, value) else None


class ConversationId(Segment):
    # Its canonical form only (not urn:uuid:…, braces or capitals): one name per conversation.
    canonical = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    description = "The conversation's id: a UUID in its canonical lower-case form."


class Number(Segment):
    """A number its column holds, in decimal: ASCII digits, no sign, no leading zero."""

    limit: ClassVar[int]

    @classmethod
    def parse(cls, value: str) -> int | None:
        number = super().parse(value)
        return int(number) if number is not None and int(number) <= cls.limit else None


class Seq(Number):
    canonical, limit = "(0|[1-9][0-9]{0,9})", 2**31 - 1
    description = "The message's seq in its conversation: 0, 1, 2, … in decimal."


class Version(Number):
    canonical, limit = "[1-9][0-9]{0,9}", 2**31 - 1
    description = "The summary's version in its conversation: 1, 2, 3, … in decimal."


class Subject(Segment):
    """Decoded from its percent-encoding; what the pattern cannot state is in words (and in
    ``services.subject_problem``)."""

    canonical = "[^/\\u0000-\\u001f\\u007f-\\u009f]{1,200}"
    description = (
        "The subject, percent-encoded: 1 to 200 characters, with no slash, no control "
        "character and no whitespace at either end, and not `.` or `..`. A name no subject "
        "can have answers 404."
    )

    @classmethod
    def parse(cls, value: str) -> str | None:
        return value if value and not subject_problem(value) else None


# Their names in a route: <ctxsum_id:pk>, …
CONVERTERS: dict[str, type[Segment]] = {
    "ctxsum_id": ConversationId,
    "ctxsum_seq": Seq,
    "ctxsum_version": Version,
    "ctxsum_subject": Subject,
}
