"""When to compact a conversation and where to cut it: pure functions, no ORM, no I/O.

Everything here works on the active context as it would be sent, in OpenAI chat format:
an optional leading system/developer message, the active summary (a user message) if
there is one, then the active messages. The pinned front (``history_start`` messages) is
never archived; ``messages[start:cutoff]`` is what a compaction archives and replaces with
a new summary; ``messages[cutoff:]`` is the tail kept verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ctxsum.tokens import context_tokens

Message = Mapping[str, Any]

UNITS = ("messages", "tokens")

NOT_AN_OBJECT = '{field} must be an object such as {{"messages": 20}} or {{"tokens": 8000}}.'
UNKNOWN_KEYS = "{field} has unknown keys {keys}; the allowed keys are messages and tokens."
NOT_POSITIVE_INT = "{field}.{unit} must be a positive integer, not {value!r}."
TRIGGER_EMPTY = "trigger needs at least one of messages or tokens."
KEEP_NOT_ONE_UNIT = "keep needs exactly one of messages or tokens."
KEEP_NOT_BELOW_TRIGGER = (
    "keep.{unit} ({keep}) must be less than trigger.{unit} ({trigger}); otherwise a "
    "compaction would have nothing to summarize."
)


class Reason(StrEnum):
    """Why a compaction did or did not happen (stored with every attempt)."""

    BELOW_TRIGGER = "below_trigger"
    NOTHING_TO_SUMMARIZE = "nothing_to_summarize"
    KEPT_TAIL_OVER_TRIGGER = "kept_tail_over_trigger"
    IN_PROGRESS = "in_progress"
    CONFLICT = "conflict"
    DRY_RUN = "dry_run"
    COMPACTED = "compacted"


class PolicyError(ValueError):
    """A trigger or keep setting is malformed; ``field`` is ``"trigger"`` or ``"keep"``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _check_amount(field: str, unit: str, value: object) -> None:
    # bool is an int subclass, but {"messages": true} is a mistake, not the number 1.
    if value is not None and (type(value) is not int or value < 1):
        raise PolicyError(field, NOT_POSITIVE_INT.format(field=field, unit=unit, value=value))


@dataclass(frozen=True)
class Trigger:
    """When to compact: with both keys set, both thresholds must be reached."""

    messages: int | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        _check_amount("trigger", "messages", self.messages)
        _check_amount("trigger", "tokens", self.tokens)

    def reached(self, message_count: int, token_count: int) -> bool:
        """Whether a context of this size should be compacted (thresholds are inclusive).

        A trigger with neither key never fires.
        """
        if self.messages is None and self.tokens is None:
            return False
        if self.messages is not None and message_count < self.messages:
            return False
        return self.tokens is None or token_count >= self.tokens

    def as_dict(self) -> dict[str, int]:
        return _as_dict(self.messages, self.tokens)


@dataclass(frozen=True)
class Keep:
    """How much recent history stays verbatim: exactly one of messages or tokens."""

    messages: int | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.tokens is None):
            raise PolicyError("keep", KEEP_NOT_ONE_UNIT)
        _check_amount("keep", "messages", self.messages)
        _check_amount("keep", "tokens", self.tokens)

    def as_dict(self) -> dict[str, int]:
        return _as_dict(self.messages, self.tokens)


@dataclass(frozen=True)
class Policy:
    """A trigger and a retention rule that can work together."""

    trigger: Trigger
    keep: Keep

    def __post_init__(self) -> None:
        # Keeping as much as the trigger allows leaves nothing to summarize, so every
        # append past the trigger would start a compaction that can never happen.
        for unit in UNITS:
            kept, limit = getattr(self.keep, unit), getattr(self.trigger, unit)
            if kept is not None and limit is not None and kept >= limit:
                raise PolicyError(
                    "keep", KEEP_NOT_BELOW_TRIGGER.format(unit=unit, keep=kept, trigger=limit)
                )


def _as_dict(messages: int | None, tokens: int | None) -> dict[str, int]:
    values = {"messages": messages, "tokens": tokens}
    return {unit: value for unit, value in values.items() if value is not None}


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


def parse_policy(trigger: object, keep: object) -> Policy:
    """A Policy from the JSON forms of its trigger and keep; rejects keep >= trigger."""
    return Policy(trigger=parse_trigger(trigger), keep=parse_keep(keep))


def pair_tool_results(messages: Sequence[Message]) -> dict[int, int | None]:
    """For each tool message's index, the index of the assistant message that requested it.

    Providers reuse ids across turns, so a result belongs to the nearest earlier request
    carrying its ``tool_call_id``. ``None`` marks an orphan: no earlier request at all.
    """
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


def history_start(*, leading: bool, has_summary: bool) -> int:
    """How many messages at the front are pinned: the leading system/developer message,
    then the active summary. They are never archived; a new summary replaces the old one."""
    return int(leading) + int(has_summary)


def retention_cutoff(tokens: Sequence[int], *, start: int, keep: Keep) -> int:
    """The preferred cutoff: the index of the first message the retention rule keeps.

    In tokens mode whole messages are kept, newest first, while they fit in the budget;
    the newest message is kept even if it alone is over it.
    """
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


def safe_cutoff(messages: Sequence[Message], *, start: int, candidate: int) -> int:
    """``candidate`` moved so that no tool call is separated from its results.

    Moves back to the requesting assistant message when the tail would keep results of a
    request that gets archived; moves forward past orphaned results (their request is gone
    or pinned) that would otherwise head the tail, but never archives the newest message.
    """
    count = len(messages)
    cutoff = min(max(candidate, start), count)
    pairs = pair_tool_results(messages)

    # earliest_request[i]: the smallest archivable request index among results at >= i.
    # A cutoff c is unsafe exactly when earliest_request[c] < c; every cutoff between
    # earliest_request[c] and c is then unsafe too, so jumping there loses nothing, and
    # since the jump can bring more results into the tail the loop repeats until stable.
    earliest_request = [count] * (count + 1)
    for index in range(count - 1, -1, -1):
        request = pairs.get(index)
        earliest = earliest_request[index + 1]
        if request is not None and request >= start:
            earliest = min(earliest, request)
        earliest_request[index] = earliest
    moved_back = False
    while earliest_request[cutoff] < cutoff:
        cutoff = earliest_request[cutoff]
        moved_back = True
    if moved_back:
        # The cutoff now sits on an assistant message, never on a result.
        return cutoff

    # Results at the cutoff whose request is archived already or pinned are invalid in
    # any request; archive them with the history rather than keep them at the tail's head.
    while cutoff < count - 1 and cutoff in pairs:
        request = pairs[cutoff]
        if request is not None and request >= start:
            break
        cutoff += 1
    return cutoff


@dataclass(frozen=True)
class Plan:
    """What a compaction of a context would do: archive ``messages[start:cutoff]``.

    The ``*_after`` numbers estimate the compacted context (pinned messages, one summary,
    the kept tail); an existing summary's size stands in for the new one's.
    """

    reason: Reason
    start: int
    cutoff: int
    message_count_before: int
    tokens_before: int
    message_count_after: int
    tokens_after: int

    @property
    def compacts(self) -> bool:
        return self.reason == Reason.COMPACTED


def plan_compaction(
    messages: Sequence[Message],
    tokens: Sequence[int],
    *,
    leading: bool,
    has_summary: bool,
    policy: Policy,
    force: bool = False,
) -> Plan:
    """Decide whether and where to compact the active context ``messages``.

    ``tokens`` holds each message's token count. ``force`` ignores the trigger (a manual
    compaction) but still honours the pinned front, retention and tool boundaries.
    """
    count = len(messages)
    if len(tokens) != count:
        raise ValueError(f"{len(tokens)} token counts for {count} messages.")
    start = history_start(leading=leading, has_summary=has_summary)
    if start > count:
        raise ValueError(f"history_start {start} is past the {count} messages.")
    tokens_before = context_tokens(tokens)

    def plan(reason: Reason, cutoff: int, count_after: int, tokens_after: int) -> Plan:
        return Plan(reason, start, cutoff, count, tokens_before, count_after, tokens_after)

    if not force and not policy.trigger.reached(count, tokens_before):
        return plan(Reason.BELOW_TRIGGER, start, count, tokens_before)

    cutoff = safe_cutoff(
        messages, start=start, candidate=retention_cutoff(tokens, start=start, keep=policy.keep)
    )
    if cutoff <= start:
        return plan(Reason.NOTHING_TO_SUMMARIZE, start, count, tokens_before)

    summary_estimate = tokens[int(leading)] if has_summary else 0
    count_after = int(leading) + 1 + (count - cutoff)
    tokens_after = context_tokens([*tokens[: int(leading)], summary_estimate, *tokens[cutoff:]])
    # Compacting a context whose tail alone keeps it over the trigger would start another
    # compaction on the very next append, re-summarizing in a loop for nothing.
    if not force and policy.trigger.reached(count_after, tokens_after):
        return plan(Reason.KEPT_TAIL_OVER_TRIGGER, cutoff, count_after, tokens_after)
    return plan(Reason.COMPACTED, cutoff, count_after, tokens_after)
