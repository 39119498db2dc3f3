"""The conversation list's actions: each runs a service on one conversation at a time and
reports how many ended which way ("3 rebuilt, 1 conflict, 2 had nothing to rebuild")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.utils.translation import gettext
from django.utils.translation import ngettext_lazy as _n

from ctxsum.exceptions import SummarizerError
from ctxsum.models import Conversation, Summary
from ctxsum.policy import Reason
from ctxsum.selectors import summary_is_stale
from ctxsum.services import conversation_compact, conversation_rebuild, conversation_revert

# Each selected conversation may cost a summarizer call of many seconds, inside the request.
ACTION_LIMIT = 10
FAILED = "failed"
GONE = "gone"
NOT_STALE = "not_stale"
NOTHING_TO_REBUILD = "nothing_to_rebuild"
NOTHING_TO_REVERT = "nothing_to_revert"

OUTCOMES = {
    Reason.COMPACTED: _n("%(count)d compacted", "%(count)d compacted", "count"),
    Reason.REBUILT: _n("%(count)d rebuilt", "%(count)d rebuilt", "count"),
    Reason.REVERTED: _n("%(count)d reverted", "%(count)d reverted", "count"),
    Reason.DRY_RUN: _n("%(count)d would compact", "%(count)d would compact", "count"),
    Reason.BELOW_TRIGGER: _n(
        "%(count)d below its trigger", "%(count)d below their trigger", "count"
    ),
    Reason.NOTHING_TO_SUMMARIZE: _n(
        "%(count)d had nothing to summarize", "%(count)d had nothing to summarize", "count"
    ),
    NOTHING_TO_REBUILD: _n(
        "%(count)d had nothing to rebuild", "%(count)d had nothing to rebuild", "count"
    ),
    NOTHING_TO_REVERT: _n(
        "%(count)d had nothing to revert", "%(count)d had nothing to revert", "count"
    ),
    NOT_STALE: _n("%(count)d not stale", "%(count)d not stale", "count"),
    Reason.NO_GAIN: _n(
        "%(count)d no gain (the summary would not be smaller)",
        "%(count)d no gain (the summaries would not be smaller)",
        "count",
    ),
    Reason.IN_PROGRESS: _n(
        "%(count)d busy (another worker holds the lease)",
        "%(count)d busy (another worker holds the lease)",
        "count",
    ),
    Reason.CONFLICT: _n("%(count)d conflict", "%(count)d conflicts", "count"),
    FAILED: _n("%(count)d failed", "%(count)d failed", "count"),
    GONE: _n("%(count)d deleted meanwhile", "%(count)d deleted meanwhile", "count"),
}
TROUBLE = {Reason.CONFLICT, Reason.IN_PROGRESS, FAILED, GONE}


@dataclass
class Tally:
    """How many conversations ended which way, and a line for each that needs one."""

    counts: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [_phrase(outcome, count) for outcome, count in self.counts.most_common()]
        return ", ".join(parts) or gettext("Nothing was selected.")

    @property
    def level(self) -> int:
        return messages.WARNING if TROUBLE & set(self.counts) else messages.SUCCESS


def _phrase(outcome: str, count: int) -> str:
    template = OUTCOMES.get(outcome)
    if template is None:  # a reason this module does not word yet
        return f"{count} {outcome}"
    return str(template % {"count": count})


def _each(
    conversations: Iterable[Conversation], run: Callable[[Conversation, Tally], str]
) -> Tally:
    """``run`` on each conversation in turn; a summarizer failure, or a conversation
    deleted meanwhile, is counted and the others go on."""
    tally = Tally()
    for conversation in conversations:
        try:
            outcome = run(conversation, tally)
        except SummarizerError as error:
            outcome = FAILED
            note = gettext("%(title)s: failed: %(error)s")
            tally.notes.append(note % {"title": str(conversation), "error": error})
        except Conversation.DoesNotExist:
            outcome = GONE
        tally.counts[outcome] += 1
    return tally


def compact(conversations: Iterable[Conversation], *, dry_run: bool) -> Tally:
    """Compact each conversation now, ignoring its trigger (or, ``dry_run``, say what that
    would do, one line per conversation)."""

    def run(conversation: Conversation, tally: Tally) -> str:
        result = conversation_compact(conversation=conversation, force=True, dry_run=dry_run)
        if dry_run and result.plan is not None and result.archived:
            tally.notes.append(
                gettext(
                    "%(title)s: would archive %(count)d messages (seq %(first)d-%(last)d), "
                    "%(before)d -> about %(after)d tokens"
                )
                % {
                    "title": str(conversation),
                    "count": len(result.archived),
                    "first": result.archived[0].seq,
                    "last": result.archived[-1].seq,
                    "before": result.plan.tokens_before,
                    "after": result.plan.tokens_after,
                }
            )
        return str(result.reason)

    return _each(conversations, run)


def _active(conversations: list[Conversation]) -> QuerySet[Summary]:
    """The active summaries of ``conversations``, in one query."""
    return Summary.objects.filter(conversation__in=[c.pk for c in conversations], active=True)


def rebuild(conversations: Iterable[Conversation]) -> Tally:
    """Rebuild the active summary of each conversation where it is stale; the others are
    counted as not stale, or as having nothing to rebuild."""
    selected = list(conversations)
    summaries = {summary.conversation_id: summary for summary in _active(selected)}

    def run(conversation: Conversation, tally: Tally) -> str:
        summary = summaries.get(conversation.pk)
        if summary is None:
            return NOTHING_TO_REBUILD
        if not summary_is_stale(summary):
            return NOT_STALE
        result = conversation_rebuild(conversation=conversation)
        if result.reason == Reason.NOTHING_TO_SUMMARIZE:
            return NOTHING_TO_REBUILD
        return str(result.reason)

    return _each(selected, run)


def revert(conversations: Iterable[Conversation]) -> Tally:
    """Undo the last compaction of each conversation: revert its active summary (one
    version back, however many there are); those without one have nothing to revert."""
    selected = list(conversations)
    versions = dict(_active(selected).values_list("conversation_id", "version"))

    def run(conversation: Conversation, tally: Tally) -> str:
        version = versions.get(conversation.pk)
        if version is None:
            return NOTHING_TO_REVERT
        try:
            result = conversation_revert(conversation=conversation, version=version)
        except ValidationError:
            # Another request changed the active summary since it was read here.
            return str(Reason.CONFLICT)
        return str(result.reason)

    return _each(selected, run)
