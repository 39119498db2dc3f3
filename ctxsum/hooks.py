"""The seams the core offers to the apps that extend it: an optional app (``ctxsum.facts``)
registers here from its ``AppConfig.ready()``, by name (registering again replaces), and the
core calls what is registered without importing the app.

- **Blocks**: a contributor adds one pinned message to a context, after the summary.
- **Commits**: a ``CommitHook`` takes part in the core's commits inside their transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxsum.models import Conversation, Summary


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


@dataclass(frozen=True, kw_only=True)
class SummaryCommitted:
    """A compaction or a rebuild commits ``summary``; ``facts``: the key facts its calls
    proposed; ``room``: the most tokens the contributed blocks may grow by (the context
    must still shrink)."""

    facts: Sequence[Any] = ()
    summary: Summary | None = None
    room: int | None = None


@dataclass(frozen=True, kw_only=True)
class SummaryReverted:
    """A revert makes ``target`` inactive and restores the messages it archived."""

    target: Summary


@dataclass(frozen=True, kw_only=True)
class MessageRedacted:
    """The message at ``seq`` is redacted: what an app derived from it must go."""

    seq: int


@dataclass(frozen=True, kw_only=True)
class ConversationChanged:
    """A conversation is created or updated: ``given``, the fields the caller sets (known
    before the row lock); ``changed``, those whose value changed (known under it)."""

    given: frozenset[str]
    changed: frozenset[str] = frozenset()


Event = SummaryCommitted | SummaryReverted | MessageRedacted | ConversationChanged


class LockAgain(Exception):
    """What a hook locked no longer covers the commit (the rows it locked by changed
    meanwhile): the commit rolls back and starts over, every concerned hook locking first."""


class CommitHook:
    """What an app does inside the core's commits: ``concerns`` is asked before the
    transaction; in it, ``lock`` comes before the commit's row lock and ``apply`` after its
    own changes (it may move the row's counters, which the commit saves)."""

    def concerns(self, conversation: Conversation, event: Event, *, db: str) -> bool:
        return False

    def lock(self, conversation: Conversation, event: Event, *, db: str) -> Any:
        return None

    def apply(self, event: Event, *, locked: Conversation, held: Any) -> None:
        return None


_commit_hooks: dict[str, CommitHook] = {}


def register_commit_hook(name: str, hook: CommitHook) -> None:
    """Register ``hook`` under ``name``; the commits call hooks in registration order."""
    _commit_hooks[name] = hook


# The hooks a commit concerns, by name in registration order, and what each ``lock`` returned.
Held = dict[str, Any]


def concerned(conversation: Conversation, event: Event, *, db: str) -> frozenset[str]:
    """The names of the hooks ``event`` concerns for ``conversation``."""
    hooks = _commit_hooks.items()
    return frozenset(name for name, hook in hooks if hook.concerns(conversation, event, db=db))


def commit_lock(
    conversation: Conversation, names: frozenset[str], event: Event, *, db: str
) -> Held:
    """The locks of the hooks ``names``, taken before the commit's row lock."""
    hooks = [(name, hook) for name, hook in _commit_hooks.items() if name in names]
    return {name: hook.lock(conversation, event, db=db) for name, hook in hooks}


def newly_concerned(locked: Conversation, event: Event, held: Held, *, db: str) -> bool:
    """Under the row lock: whether a hook that locked nothing is concerned by now (what it
    reads changed since it was asked); the commit must then start over."""
    others = [hook for name, hook in _commit_hooks.items() if name not in held]
    return any(hook.concerns(locked, event, db=db) for hook in others)


def commit_apply(held: Held, event: Event, *, locked: Conversation) -> None:
    """The hooks that locked, told of ``event`` inside the transaction."""
    for name, lock in held.items():
        _commit_hooks[name].apply(event, locked=locked, held=lock)
