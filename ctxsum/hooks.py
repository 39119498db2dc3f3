"""The seams the core offers to the apps that extend it.

An optional app (``ctxsum.facts``) registers here from its ``AppConfig.ready()``; the core
calls what is registered and never imports the app. Registrations are made once per process,
at startup, and are keyed by name, so registering again (a second ``ready()`` in tests)
replaces rather than repeats.

- **Blocks**: a contributor adds one pinned user message to a conversation's context, after
  the summary (the key facts block). ``selectors.context_get`` asks every contributor, in
  the order they registered; a compaction keeps each block as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxsum.models import Conversation


@dataclass(frozen=True, kw_only=True)
class Block:
    """A pinned message contributed to a context: its ``kind`` (the contributor's name), the
    message as sent, its tokens, and what it shows (the contributor's own rows)."""

    kind: str
    message: dict[str, Any]
    tokens: int
    shows: Sequence[Any] = field(default_factory=tuple)


# A contributor reads the block of a conversation as it stands now; None: no block.
Contributor = Callable[["Conversation"], "Block | None"]
_contributors: dict[str, Contributor] = {}


def contribute_block(kind: str, contributor: Contributor) -> None:
    """Register ``contributor`` for the blocks of ``kind``."""
    _contributors[kind] = contributor


def context_blocks(conversation: Conversation) -> list[Block]:
    """The blocks of ``conversation``'s context, in the order their contributors registered."""
    blocks = (contributor(conversation) for contributor in _contributors.values())
    return [block for block in blocks if block is not None]
