"""When to compact a conversation and where to cut it: pure functions, no ORM, no I/O.

The planner reads the active context as its ``ContextLayout`` (``ctxsum.layout``) and
returns the range of body seqs a compaction archives behind a new summary.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from ctxsum.exceptions import SummarizerError, SummaryTruncated
from ctxsum.layout import PINNED_MAX, ContextLayout, SeqRange

Message = Mapping[str, Any]

UNITS = ("messages", "tokens")
# Roles a conversation's first message may have to be pinned as its leading message.
LEADING_ROLES = ("system", "developer")

NOT_AN_OBJECT = _('{field} must be an object such as {{"messages": 20}} or {{"tokens": 8000}}.')
UNKNOWN_KEYS = _("{field} has unknown keys {keys}; the allowed keys are messages and tokens.")
NOT_POSITIVE_INT = _("{field}.{unit} must be a positive integer, not {value!r}.")
NOT_POSITIVE = _("{field} must be a positive integer or null, not {value!r}.")
TOO_LARGE = _("{field} must be at most {limit}, not {value!r}.")
TRIGGER_EMPTY = _("trigger needs at least one of messages or tokens.")
KEEP_NOT_ONE_UNIT = _("keep needs exactly one of messages or tokens.")
KEEP_NOT_BELOW_TRIGGER = _(
    "keep.{unit} ({keep}) must be less than trigger.{unit} ({trigger}); otherwise a "
    "compaction would have nothing to summarize."
)
KEEP_LEAVES_NO_ROOM = _(
    "keep.messages ({keep}) plus the pinned system message, summary and key facts block "
    "reaches trigger.messages ({trigger}): every compacted context would still reach the "
    "trigger. Keep at most {most} messages."
)
# The largest max_context_tokens a conversation can store (its column's range everywhere).
MAX_CONTEXT_TOKENS_LIMIT = 2**31 - 1
# The landing rules (``Sizing.landing``, the LANDING setting).
TARGET_LANDING, KEEP_LANDING = "target", "keep"
LANDINGS = (TARGET_LANDING, KEEP_LANDING)
# How many later model calls must repay a compaction's summarizer call (``Payoff``): how
# long a conversation runs on is unknown, so a compaction is made only when it pays back
# quickly. Chosen on the real conversations of docs/PERFORMANCE.md (section 1): with 4,
# short dialogues never cost more than sending them whole, and agent runs, whose tool
# results are large, compact as soon as they are due.
PAYBACK_CALLS = 4
# The smallest summary length a compaction asks for, in tokens.
MIN_SUMMARY_BUDGET = 32
# OpenAI's model families by name prefix: the context window and the largest reply, in
# tokens, from each model's page at platform.openai.com/docs/models.
CONTEXT_WINDOWS = {
    "gpt-5": (400_000, 128_000),
    "gpt-4.1": (1_047_576, 32_768),
    "gpt-4o": (128_000, 16_384),
    "o1-mini": (128_000, 65_536),
    "o1-preview": (128_000, 32_768),
    **dict.fromkeys(("o1", "o3", "o4-mini"), (200_000, 100_000)),
}
# The window assumed for any other model.
FALLBACK_WINDOW = (128_000, 16_384)


def default_ceiling(model: str) -> int:
    """The ceiling of a conversation that sets none (MAX_CONTEXT_TOKENS unset): the largest
    context that leaves ``model`` room for its largest reply, by its family's window."""
    families = [prefix for prefix in CONTEXT_WINDOWS if model.lower().startswith(prefix)]
    window, reply = CONTEXT_WINDOWS.get(max(families, key=len, default=""), FALLBACK_WINDOW)
    return window - reply


class Reason(StrEnum):
    """Why a compaction did or did not happen (stored with every attempt)."""

    BELOW_TRIGGER = "below_trigger"
    NOTHING_TO_SUMMARIZE = "nothing_to_summarize"
    NO_GAIN = "no_gain"
    # Due, but the summarizer call would cost more than the smaller context saves.
    NO_PAYOFF = "no_payoff"
    IN_PROGRESS = "in_progress"
    CONFLICT = "conflict"
    DRY_RUN = "dry_run"
    DEFERRED = "deferred"
    QUEUED = "queued"
    COMPACTED = "compacted"
    REBUILT = "rebuilt"
    REVERTED = "reverted"
    SUMMARIZER_ERROR = "summarizer_error"
    SUMMARY_TRUNCATED = "summary_truncated"
    ERROR = "error"
    # The worker stopped inside the summarizer call (a timeout, a cancellation, an exit).
    INTERRUPTED = "interrupted"

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        """The reasons as a model field's choices."""
        return [(reason.value, reason.value) for reason in cls]


def failure_reason(error: BaseException) -> Reason:
    """The reason a failed compaction is recorded with: ``interrupted`` for what is not an
    ``Exception`` (an exit, a timeout, a cancellation), which stopped the worker."""
    if not isinstance(error, Exception):
        return Reason.INTERRUPTED
    if isinstance(error, SummaryTruncated):
        return Reason.SUMMARY_TRUNCATED
    if isinstance(error, SummarizerError):
        return Reason.SUMMARIZER_ERROR
    return Reason.ERROR


class PolicyError(ValueError):
    """A trigger or keep setting is malformed; ``field`` is ``"trigger"`` or ``"keep"``."""

    def __init__(self, field: str, message: str | Promise) -> None:
        super().__init__(str(message))
        self.field = field


def _check_amount(field: str, unit: str, value: object) -> None:
    # bool is an int subclass, but {"messages": true} is a mistake, not the number 1.
    if value is not None and (type(value) is not int or value < 1):
        message = NOT_POSITIVE_INT if unit else NOT_POSITIVE
        raise PolicyError(field, message.format(field=field, unit=unit, value=value))
    if not unit and isinstance(value, int) and value > MAX_CONTEXT_TOKENS_LIMIT:
        limit = MAX_CONTEXT_TOKENS_LIMIT
        raise PolicyError(field, TOO_LARGE.format(field=field, limit=limit, value=value))


@dataclass(frozen=True, kw_only=True)
class Trigger:
    """When to compact: with both keys set, both thresholds must be reached."""

    messages: int | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        _check_amount("trigger", "messages", self.messages)
        _check_amount("trigger", "tokens", self.tokens)

    def reached(self, message_count: int, token_count: int) -> bool:
        """Whether a context of this size should be compacted (thresholds are inclusive)."""
        if self.messages is None and self.tokens is None:
            return False
        if self.messages is not None and message_count < self.messages:
            return False
        return self.tokens is None or token_count >= self.tokens

    def within(self, ratio: float, message_count: int, token_count: int) -> bool:
        """Whether a context of this size is at most ``ratio`` of the trigger in a unit it
        sets (every set threshold must be reached to fire)."""
        sizes = {"messages": message_count, "tokens": token_count}
        return any(
            sizes[unit] <= int(limit * ratio)
            for unit in UNITS
            if (limit := getattr(self, unit)) is not None
        )


@dataclass(frozen=True, kw_only=True)
class Keep:
    """How much recent history stays verbatim: exactly one of messages or tokens."""

    messages: int | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.tokens is None):
            raise PolicyError("keep", KEEP_NOT_ONE_UNIT)
        _check_amount("keep", "messages", self.messages)
        _check_amount("keep", "tokens", self.tokens)


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A trigger, a retention rule that works with it, and an optional token ceiling."""

    trigger: Trigger
    keep: Keep
    max_context_tokens: int | None = None

    def over(self, message_count: int, token_count: int) -> bool:
        """Whether a context of this size reaches the trigger or exceeds the ceiling."""
        return self.exceeds(token_count) or self.trigger.reached(message_count, token_count)

    def exceeds(self, token_count: int) -> bool:
        """Whether a context of ``token_count`` tokens exceeds the ceiling."""
        ceiling = self.max_context_tokens
        return ceiling is not None and token_count > ceiling

    def __post_init__(self) -> None:
        _check_amount("max_context_tokens", "", self.max_context_tokens)
        # Keeping as much as the trigger allows leaves nothing to summarize, so every
        # append past the trigger would start a compaction that can never happen.
        for unit in UNITS:
            kept, limit = getattr(self.keep, unit), getattr(self.trigger, unit)
            if kept is not None and limit is not None and kept >= limit:
                raise PolicyError(
                    "keep", KEEP_NOT_BELOW_TRIGGER.format(unit=unit, keep=kept, trigger=limit)
                )
        kept, limit = self.keep.messages, self.trigger.messages
        if kept is not None and limit is not None and kept + PINNED_MAX >= limit:
            raise PolicyError(
                "keep",
                KEEP_LEAVES_NO_ROOM.format(
                    keep=kept, trigger=limit, most=max(limit - PINNED_MAX - 1, 0)
                ),
            )


def _amounts(field: str, value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise PolicyError(field, NOT_AN_OBJECT.format(field=field))
    unknown = sorted(str(key) for key in value if key not in UNITS)
    if unknown:
        raise PolicyError(field, UNKNOWN_KEYS.format(field=field, keys=", ".join(unknown)))
    for unit in UNITS:
        _check_amount(field, unit, value.get(unit))
    return dict(value)


def parse_trigger(value: object) -> Trigger:
    """A Trigger from its JSON form, e.g. ``{"messages": 20, "tokens": 8000}``."""
    amounts = _amounts("trigger", value)
    if not amounts or all(amounts.get(unit) is None for unit in UNITS):
        raise PolicyError("trigger", TRIGGER_EMPTY)
    return Trigger(**amounts)


def parse_keep(value: object) -> Keep:
    """A Keep from its JSON form, ``{"messages": N}`` or ``{"tokens": N}``."""
    return Keep(**_amounts("keep", value))


def parse_policy(trigger: object, keep: object, max_context_tokens: object = None) -> Policy:
    """A Policy from the JSON forms of its parts."""
    key = _policy_key(trigger, keep, max_context_tokens)
    if key is None:
        return _parse_policy(trigger, keep, max_context_tokens)
    return _parsed_policy(key)


# Every append with AUTO_COMPACT on asks for its conversation's policy, and most
# conversations share a few: a policy of plain amounts is parsed once (a refusal every time).
_Amounts = tuple[tuple[str, int | None], ...]
_PolicyKey = tuple[_Amounts, _Amounts, int | None]


def _policy_key(trigger: object, keep: object, max_context_tokens: object) -> _PolicyKey | None:
    """The parts as a hashable key, or None when any is not made of strings and ints (a
    bool or a float equals an int as a key, and must still be refused)."""
    if not (max_context_tokens is None or type(max_context_tokens) is int):
        return None
    parts = []
    for part in (trigger, keep):
        if type(part) is not dict:
            return None
        items = tuple(part.items())
        if not all(type(k) is str and (v is None or type(v) is int) for k, v in items):
            return None
        parts.append(items)
    return parts[0], parts[1], max_context_tokens


@functools.lru_cache(maxsize=256)
def _parsed_policy(key: _PolicyKey) -> Policy:
    trigger, keep, max_context_tokens = key
    return _parse_policy(dict(trigger), dict(keep), max_context_tokens)


def _parse_policy(trigger: object, keep: object, max_context_tokens: object) -> Policy:
    _check_amount("max_context_tokens", "", max_context_tokens)
    return Policy(
        trigger=parse_trigger(trigger),
        keep=parse_keep(keep),
        max_context_tokens=max_context_tokens,  # type: ignore[arg-type]
    )


def pair_tool_results(messages: Sequence[Message]) -> dict[int, int | None]:
    """For each tool message's index, the index of the nearest earlier assistant message
    requesting its ``tool_call_id`` (providers reuse ids), or None for an orphan."""
    requested_at: dict[str, int] = {}
    pairs: dict[int, int | None] = {}
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                call_id = call.get("id")
                if call_id is not None:
                    requested_at[call_id] = index
        elif role == "tool":
            call_id = message.get("tool_call_id")
            pairs[index] = requested_at.get(call_id) if call_id is not None else None
    return pairs


def retention_cutoff(tokens: Sequence[int], *, start: int, keep: Keep) -> int:
    """The index of the first message the retention rule keeps: in tokens mode, whole
    messages, newest first, while they fit (the newest even if it alone does not)."""
    count = len(tokens)
    if keep.messages is not None:
        return max(start, count - keep.messages)
    assert keep.tokens is not None
    cutoff = count
    kept = 0
    for index in range(count - 1, start - 1, -1):
        cost = max(0, tokens[index])
        if cutoff < count and kept + cost > keep.tokens:
            break
        kept += cost
        cutoff = index
    return max(start, cutoff)


class _ToolBoundaries:
    """Where a context may be cut without separating a tool call from its results."""

    def __init__(self, messages: Sequence[Message], start: int) -> None:
        self.count = count = len(messages)
        self.start = start
        self.pairs = pairs = pair_tool_results(messages)
        # earliest_request[i]: the smallest archivable request index among results at >= i.
        # A cutoff c is unsafe exactly when earliest_request[c] < c; every cutoff between
        # earliest_request[c] and c is then unsafe too, so jumping there loses nothing.
        self.earliest_request = [count] * (count + 1)
        for index in range(count - 1, -1, -1):
            request = pairs.get(index)
            earliest = self.earliest_request[index + 1]
            if request is not None and request >= start:
                earliest = min(earliest, request)
            self.earliest_request[index] = earliest

    def safe(self, candidate: int) -> int:
        """``candidate`` as ``safe_cutoff`` moves it."""
        count, pairs = self.count, self.pairs
        cutoff = min(max(candidate, self.start), count)
        moved_back = False
        # Jumping back can bring more results into the tail: repeat until stable.
        while self.earliest_request[cutoff] < cutoff:
            cutoff = self.earliest_request[cutoff]
            moved_back = True
        if moved_back:
            # The cutoff now sits on an assistant message, never on a result.
            return cutoff
        # Results at the cutoff whose request is archived already or pinned are invalid in
        # any request; archive them with the history rather than keep them at the tail's head.
        while cutoff < count - 1 and cutoff in pairs:
            request = pairs[cutoff]
            if request is not None and request >= self.start:
                break
            cutoff += 1
        return cutoff


def safe_cutoff(messages: Sequence[Message], *, start: int, candidate: int) -> int:
    """``candidate`` moved so that no tool call is separated from its results: back to the
    request of a result the tail would keep, or forward past orphaned results (their request
    gone or pinned) at the tail's head; the newest message is never archived."""
    return _ToolBoundaries(messages, start).safe(candidate)


def summary_budget(
    *, previous_tokens: int, archived_tokens: int, max_tokens: int, goal_tokens: int | None
) -> int:
    """How many tokens the new summary is asked to fit in: the previous summary's size plus
    half of the newly archived messages (it grows with the conversation, so older facts are
    not squeezed out), under three quarters of ``max_tokens`` (a model may overshoot) and
    at most half of ``goal_tokens``, so the kept tail has the rest."""
    budget = min(max_tokens * 3 // 4, previous_tokens + archived_tokens // 2)
    if goal_tokens is not None:
        budget = min(budget, goal_tokens // 2)
    return max(MIN_SUMMARY_BUDGET, budget)


@dataclass(frozen=True, kw_only=True)
class Sizing:
    """What the planner knows of summaries, and how far below the trigger it aims."""

    target_ratio: float = 0.5
    # "target": keep fewer than ``keep`` when needed to land at ``target_ratio``; "keep":
    # only when keeping all of it would leave the context at the trigger.
    landing: str = "target"
    summary_max_tokens: int = 1024
    # Tokens of the summary message besides the summary text (role framing, prefix).
    summary_overhead: int = 0
    # Tokens every summarizer call costs besides the history and the summary (its
    # instruction, the facts of its answer); None: a compaction that is due is made whether
    # or not it pays (``Payoff``). ``blocks_growth``: tokens the contributed blocks are
    # expected to grow by after it (the facts it brings).
    prompt_tokens: int | None = None
    blocks_growth: int = 0


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a compaction would do: archive the seqs in ``archive`` (None: none), keep the
    newest ``kept`` verbatim, and ask for a summary of at most ``summary_budget`` tokens.
    The ``*_after`` numbers estimate the compacted context; ``over_trigger``: it would
    still reach the trigger or exceed the ceiling (with the incoming messages)."""

    reason: Reason
    archive: SeqRange | None
    kept: int
    message_count_before: int
    tokens_before: int
    message_count_after: int
    tokens_after: int
    summary_budget: int = 0
    over_trigger: bool = False
    payoff: Payoff | None = None

    @property
    def compacts(self) -> bool:
        return self.reason == Reason.COMPACTED


@dataclass(frozen=True, kw_only=True)
class Payoff:
    """What a compaction is estimated to save and cost, in billed tokens: ``saved`` off
    every later call (the context's shrink), against ``cost``, its summarizer call's input
    and output. It pays when ``PAYBACK_CALLS`` calls repay the cost."""

    saved: int
    cost: int

    @property
    def pays(self) -> bool:
        return self.saved * PAYBACK_CALLS >= self.cost


Incoming = tuple[int, int]  # messages joining the context after a compaction: count, tokens


def plan_compaction(
    layout: ContextLayout,
    body: Sequence[Message],
    *,
    policy: Policy,
    force: bool = False,
    sizing: Sizing = Sizing(),
    incoming: Incoming = (0, 0),
) -> Plan:
    """Decide whether and where to compact the context ``layout`` describes; ``body`` holds
    its body messages (OpenAI format), for the tool boundaries. ``force`` ignores the
    trigger but still honours retention and tool boundaries.

    A compaction that is due but would not pay for itself (``Payoff``; ``sizing`` sets
    what a summarizer call costs) is not made (``no_payoff``), unless forced or over the
    ceiling.

    ``keep`` is the most that stays verbatim: fewer are kept when needed for the result to
    land at ``target_ratio`` of the trigger (and of the ceiling), so that the context has
    room to grow before the next compaction; never fewer than the newest message and its
    tool round. When no cut lands there, all of ``keep`` unless that leaves the context at
    the trigger (then the newest round alone, and ``over_trigger`` if still over).
    ``incoming`` (count, tokens): messages joining the context right after it (a chat turn's
    message and reply), which the trigger, the ceiling and the target count too.
    """
    if len(body) != len(layout.body_seqs):
        raise ValueError(f"{len(body)} body messages for {len(layout.body_seqs)} seqs.")
    estimate = _Estimates(layout, policy=policy, sizing=sizing, incoming=incoming)
    due = estimate.over(layout.message_count, estimate.tokens_before)
    if not force and not due:
        return estimate.unchanged(Reason.BELOW_TRIGGER)
    plan = _cut(estimate, _ToolBoundaries(body, 0), due=due)
    if force or not plan.compacts or sizing.prompt_tokens is None or estimate.over_ceiling():
        return plan
    payoff = estimate.payoff(plan)
    if payoff.pays:
        return replace(plan, payoff=payoff)
    return replace(estimate.unchanged(Reason.NO_PAYOFF), payoff=payoff)


def _cut(estimate: _Estimates, boundaries: _ToolBoundaries, *, due: bool) -> Plan:
    """Where a body that is due (or forced) is cut: after ``keep``, or after fewer."""
    keep = estimate.policy.keep
    # The newest message and its tool round always stay verbatim.
    last = boundaries.safe(estimate.count - 1) if estimate.count else 0
    if last <= 0:
        return estimate.unchanged(Reason.NOTHING_TO_SUMMARIZE)
    cutoff = min(boundaries.safe(retention_cutoff(estimate.tokens, start=0, keep=keep)), last)
    preferred = estimate.compaction(cutoff) if cutoff > 0 else None
    if preferred is not None and estimate.lands(preferred, keeping=True):
        return preferred
    if preferred is None and not due:
        # A forced compaction of a context whose every message retention keeps.
        return estimate.unchanged(Reason.NOTHING_TO_SUMMARIZE)
    # Keeping all of ``keep`` would leave the context above the target: keep fewer, cutting
    # only between tool rounds, until the result lands there.
    for candidate in range(cutoff + 1, last):
        if boundaries.safe(candidate) == candidate:
            option = estimate.compaction(candidate)
            if estimate.lands(option):
                return option
    # No cut lands at the target (the pinned parts alone are that large): keep all of
    # ``keep`` unless that leaves the context at the trigger.
    if preferred is not None and not preferred.over_trigger:
        return preferred
    return estimate.compaction(last)


class _Estimates:
    """The plans of one context, what every candidate cutoff shares computed once."""

    def __init__(
        self, layout: ContextLayout, *, policy: Policy, sizing: Sizing, incoming: Incoming
    ) -> None:
        self.layout, self.policy, self.sizing = layout, policy, sizing
        self.incoming = incoming
        self.tokens = layout.body_tokens
        self.count = count = len(self.tokens)
        self.tokens_before = layout.token_count
        self.goal = _goal_tokens(policy, sizing.target_ratio)
        # The budget is for summary text: the previous summary counts without the framing
        # (prefix, role) its context message adds.
        previous = layout.summary_tokens
        self.previous = max(0, previous - sizing.summary_overhead) if previous is not None else 0
        # archived[c]: tokens of the messages a compaction at cutoff c archives.
        self.archived = [0] * (count + 1)
        for index in range(count):
            self.archived[index + 1] = self.archived[index] + self.tokens[index]

    def over(self, count: int, tokens: int) -> bool:
        """Whether a context of this size, with the incoming messages, reaches the trigger
        or exceeds the ceiling."""
        return self.policy.over(count + self.incoming[0], tokens + self.incoming[1])

    def over_ceiling(self) -> bool:
        """Whether the context, with the incoming messages, exceeds the ceiling: then it is
        compacted whether or not that pays."""
        return self.policy.exceeds(self.tokens_before + self.incoming[1])

    def payoff(self, plan: Plan) -> Payoff:
        """``plan``'s savings a call, and the cost of its summarizer call. The new summary is
        expected at the size of the summary so far (a first one at its budget); the
        summarizer reads its instruction, that summary and the archived messages, and
        writes the new one; the contributed blocks grow by ``blocks_growth``."""
        summary = self.previous or plan.summary_budget
        replaced = self.archived[self.count - plan.kept]
        cost = (self.sizing.prompt_tokens or 0) + self.previous + replaced + summary
        saved = plan.tokens_before - plan.tokens_after + plan.summary_budget - summary
        return Payoff(saved=saved - self.sizing.blocks_growth, cost=cost)

    def unchanged(self, reason: Reason) -> Plan:
        return self._plan(reason, 0, self.layout.message_count, self.tokens_before)

    def _plan(
        self, reason: Reason, cutoff: int, count_after: int, tokens_after: int, budget: int = 0
    ) -> Plan:
        compacts = reason == Reason.COMPACTED
        return Plan(
            reason=reason,
            archive=self.layout.body_range(cutoff) if compacts else None,
            kept=self.count - cutoff,
            message_count_before=self.layout.message_count,
            tokens_before=self.tokens_before,
            message_count_after=count_after,
            tokens_after=tokens_after,
            summary_budget=budget,
            # Only a compaction can leave the context over: an unchanged one says so elsewhere.
            over_trigger=compacts and self.over(count_after, tokens_after),
        )

    def compaction(self, cutoff: int) -> Plan:
        """Archiving the body's first ``cutoff`` messages: the summary counted at its budget."""
        budget = summary_budget(
            previous_tokens=self.previous,
            archived_tokens=self.archived[cutoff],
            max_tokens=self.sizing.summary_max_tokens,
            goal_tokens=self.goal,
        )
        count_after, tokens_after = self.layout.compacted(
            summary_tokens=budget + self.sizing.summary_overhead, kept=self.count - cutoff
        )
        return self._plan(Reason.COMPACTED, cutoff, count_after, tokens_after, budget)

    def lands(self, plan: Plan, *, keeping: bool = False) -> bool:
        """Whether a plan, with the incoming messages, lands at ``target_ratio`` of the
        trigger and the ceiling; ``keeping`` all of ``keep`` with the "keep" landing, below
        the trigger is enough."""
        if keeping and self.sizing.landing == KEEP_LANDING:
            return not plan.over_trigger
        ratio, ceiling = self.sizing.target_ratio, self.policy.max_context_tokens
        count = plan.message_count_after + self.incoming[0]
        tokens = plan.tokens_after + self.incoming[1]
        if ceiling is not None and tokens > int(ceiling * ratio):
            return False
        return self.policy.trigger.within(ratio, count, tokens)


def _goal_tokens(policy: Policy, ratio: float) -> int | None:
    """The token size a compaction that keeps fewer aims for."""
    limits = [policy.trigger.tokens, policy.max_context_tokens]
    goals = [int(limit * ratio) for limit in limits if limit is not None]
    return min(goals) if goals else None
