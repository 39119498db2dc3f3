"""The seams the core offers to the apps that extend it.

An optional app (``ctxsum.facts``, ``ctxsum.chat``) registers here from its
``AppConfig.ready()``; the core calls what is registered and never imports the app.
Registrations are made once per process, at startup, and are keyed by name, so registering
again (a second ``ready()`` in tests) replaces rather than repeats.

- **Blocks**: a contributor adds one pinned user message to a conversation's context, after
  the summary (the key facts block). ``selectors.context_get`` asks every contributor, in
  the order they registered; a compaction keeps each block as it is.
- **Stats**: a reader adds an app's counts to a conversation's stats
  (``selectors.conversation_stats``: the chat turns' usage), after the core's.
- **Commits**: a ``CommitHook`` takes part in the core's commits (a compaction's or a
  rebuild's summary, a revert, a redaction, a conversation created or changed) inside
  their transactions: it locks what it needs before the conversation's row, and changes
  its own rows once the core's are changed (the key facts merged, undone, forgotten,
  recounted).
- **Summary facts**: the summarizers ask the model for key facts, and parse them out of its
  answer, only when an app takes them (``take_summary_facts``; the facts app merges them in
  its commit hook). Without one, the prompt asks for a summary alone.
- **Review pages**: a ``Panel`` adds a section to one of the admin's review pages (a
  conversation's, a summary's): a template, and a function that builds its context from the
  page's object (the key facts a conversation sees, those a summary wrote). An app registers
  its panels from its admin module, which the admin imports as it does the app's model
  admins; a project without the admin has no pages to add to. The same module names the
  models whose rows go with a conversation, for the admin's delete page to count.
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


# --------------------------------------------------------------------------- stats

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


# --------------------------------------------------------------------------- commits
# What a commit of the core tells the apps, inside its transaction.


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
    """What an app does inside the core's commits. Each commit asks ``concerns`` first
    (before its transaction, and again under its row lock when a hook said no), then, in its
    transaction, calls ``lock`` of each hook concerned before it locks its own row (an app's
    lock order comes first) and ``apply`` once its own changes are made, before it saves the
    conversation row. ``apply`` may move the row's counters (``active_tokens`` and the
    blocks' share); the commit saves them. The defaults concern nothing."""

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


@dataclass(frozen=True)
class Held:
    """The hooks a commit concerns, each with what its ``lock`` returned."""

    locks: tuple[tuple[str, Any], ...] = ()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.locks)


def concerned(conversation: Conversation, event: Event, *, db: str) -> frozenset[str]:
    """The names of the hooks ``event`` concerns for ``conversation``."""
    hooks = _commit_hooks.items()
    return frozenset(name for name, hook in hooks if hook.concerns(conversation, event, db=db))


def commit_lock(
    conversation: Conversation, names: frozenset[str], event: Event, *, db: str
) -> Held:
    """Inside the commit's transaction, before its row lock: the locks of the hooks
    ``names`` for ``event``."""
    hooks = [(name, hook) for name, hook in _commit_hooks.items() if name in names]
    return Held(tuple((name, hook.lock(conversation, event, db=db)) for name, hook in hooks))


def newly_concerned(locked: Conversation, event: Event, held: Held, *, db: str) -> bool:
    """Under the row lock: whether a hook that locked nothing is concerned by now (what it
    reads changed since it was asked); the commit must then start over."""
    others = [hook for name, hook in _commit_hooks.items() if name not in held.names]
    return any(hook.concerns(locked, event, db=db) for hook in others)


def commit_apply(held: Held, event: Event, *, locked: Conversation) -> None:
    """The hooks that locked, told of ``event`` inside the transaction."""
    for name, lock in held.locks:
        _commit_hooks[name].apply(event, locked=locked, held=lock)


# --------------------------------------------------------------------------- summary facts
# The apps that take the key facts a summary's calls propose (SummaryCommitted.facts).

_fact_takers: set[str] = set()


def take_summary_facts(name: str) -> None:
    """Register the app ``name`` as taking the key facts summaries propose: the summarizers
    then ask for them in their prompt and parse them out of the answer."""
    _fact_takers.add(name)


def summary_facts_wanted() -> bool:
    """Whether a summarizer should ask for key facts: an installed app takes them."""
    return bool(_fact_takers)


# --------------------------------------------------------------------------- review pages
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
