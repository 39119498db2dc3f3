"""The seams the core offers to the apps that extend it: an optional app (``ctxsum.facts``,
``ctxsum.chat``) registers here from its ``AppConfig.ready()``, by name (registering again
replaces), and the core calls what is registered without importing the app.

- **Blocks**: a contributor adds one pinned message to a context, after the summary.
- **Stats**: a reader adds an app's counts to a conversation's stats, after the core's.
- **Commits**: a ``CommitHook`` takes part in the core's commits inside their transactions.
- **Summary facts**: the summarizers ask for key facts, and parse them, only when an app
  takes them.
- **Review pages**: a ``Panel`` adds a section to one of the admin's review pages; the
  models whose rows go with a conversation are counted on its delete page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin
    from django.db.models import Model
    from django.http import HttpRequest

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


# A reader of an app's counts of a conversation, added to its stats.
StatsReader = Callable[["Conversation"], "dict[str, int]"]
_stats_readers: dict[str, StatsReader] = {}


def contribute_stats(name: str, reader: StatsReader) -> None:
    """Register ``reader`` under ``name``; its keys follow the core's and earlier readers'."""
    _stats_readers[name] = reader


def contributed_stats(conversation: Conversation) -> dict[str, int]:
    """The counts every registered reader adds to ``conversation``'s stats."""
    stats: dict[str, int] = {}
    for reader in _stats_readers.values():
        stats.update(reader(conversation))
    return stats


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


# The apps that take the key facts a summary's calls propose (SummaryCommitted.facts).

_fact_takers: set[str] = set()


def take_summary_facts(name: str) -> None:
    """Register the app ``name`` as taking the key facts summaries propose: the summarizers
    then ask for them in their prompt and parse them out of the answer."""
    _fact_takers.add(name)


def summary_facts_wanted() -> bool:
    """Whether a summarizer should ask for key facts: an installed app takes them."""
    return bool(_fact_takers)


# The sections apps add to the admin's review pages, and the rows they keep per conversation.

CONVERSATION_PAGE = "conversation"
SUMMARY_PAGE = "summary"

# Builds a panel's context from the request, the page's model admin and its object (a
# Conversation or a Summary); None leaves the panel out of the page.
PanelContext = Callable[["HttpRequest", "ModelAdmin[Any]", Any], "dict[str, Any] | None"]


@dataclass(frozen=True, kw_only=True)
class Panel:
    """A section of a review page: ``template`` is included where the page keeps its
    panels, with what ``context`` builds as ``panel`` (the page's own context around it)."""

    template: str
    context: PanelContext


@dataclass(frozen=True)
class ShownPanel:
    """A panel as a page shows it: its template and the context built for this object."""

    template: str
    context: dict[str, Any]


_panels: dict[str, dict[str, Panel]] = {CONVERSATION_PAGE: {}, SUMMARY_PAGE: {}}
_deleted_with_conversation: dict[str, type[Model]] = {}


def contribute_panel(page: str, name: str, panel: Panel) -> None:
    """Register ``panel`` under ``name`` on ``page`` (``CONVERSATION_PAGE`` or
    ``SUMMARY_PAGE``); the page shows its panels in registration order."""
    _panels[page][name] = panel


def review_panels(
    page: str, request: HttpRequest, model_admin: ModelAdmin[Any], obj: Any
) -> list[ShownPanel]:
    """The panels of ``page`` for ``obj``, each with its context, those that show."""
    panels = _panels[page].values()
    built = ((panel.template, panel.context(request, model_admin, obj)) for panel in panels)
    return [ShownPanel(template, context) for template, context in built if context is not None]


def deleted_with_conversation(name: str, model: type[Model]) -> None:
    """Register ``model`` (its ``conversation`` foreign key cascades) under ``name``."""
    _deleted_with_conversation[name] = model


def conversation_rows() -> list[type[Model]]:
    """The apps' models whose rows go with a conversation, in registration order."""
    return list(_deleted_with_conversation.values())
