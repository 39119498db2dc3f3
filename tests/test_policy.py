"""ctxsum.policy: trigger, retention, pinned front, safe tool boundary, the compaction plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxsum.layout import LEADING, SUMMARY, ContextLayout, Part, SeqRange
from ctxsum.policy import (
    KEEP_LEAVES_NO_ROOM,
    KEEP_NOT_BELOW_TRIGGER,
    KEEP_NOT_ONE_UNIT,
    MIN_SUMMARY_BUDGET,
    NOT_AN_OBJECT,
    NOT_POSITIVE_INT,
    PINNED_MAX,
    TRIGGER_EMPTY,
    UNKNOWN_KEYS,
    Keep,
    Plan,
    Policy,
    PolicyError,
    Reason,
    Sizing,
    Trigger,
    pair_tool_results,
    parse_keep,
    parse_policy,
    parse_trigger,
    retention_cutoff,
    safe_cutoff,
    summary_budget,
)
from ctxsum.policy import plan_compaction as plan_layout
from ctxsum.tokens import REPLY_PRIMING
from tests.factories import (
    Message,
    assistant_calls,
    assistant_message,
    system_message,
    tool_result,
    turns,
    user_message,
)


def summary(text: str = "Here is a summary of the conversation so far:\n\nearlier") -> Message:
    return user_message(text)


def policy(trigger: dict[str, int], keep: dict[str, int]) -> Policy:
    return parse_policy(trigger, keep)


@dataclass(frozen=True)
class Sent:
    """A plan read against the context as sent: ``start`` and ``cutoff`` index the list,
    ``messages[start:cutoff]`` is what it archives (the body's seqs are its indices)."""

    plan: Plan
    start: int

    @property
    def cutoff(self) -> int:
        archive = self.plan.archive
        return archive.last + 1 if archive else self.start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plan, name)


def plan_compaction(
    messages: list[Message],
    tokens: list[int],
    *,
    leading: bool,
    has_summary: bool,
    has_facts: bool = False,
    **options: Any,
) -> Sent:
    """The plan of a context given as sent: its pinned messages first, then the body, whose
    seqs are the messages' indices. With the "keep" landing unless ``sizing`` is given: the
    "target" landing has tests of its own (``target``)."""
    options.setdefault("sizing", Sizing(landing="keep"))
    kinds = [LEADING] * leading + [SUMMARY] * has_summary + ["facts"] * has_facts
    start = len(kinds)
    layout = ContextLayout(
        pinned=tuple(Part(kind, size) for kind, size in zip(kinds, tokens, strict=False)),
        body_seqs=tuple(range(start, len(messages))),
        body_tokens=tuple(tokens[start:]),
    )
    return Sent(plan_layout(layout, messages[start:], **options), start)


# --- trigger ---------------------------------------------------------------------------


def test_four_messages_stay_below_a_five_message_trigger() -> None:
    messages = turns(4)
    plan = plan_compaction(
        messages,
        [10] * 4,
        leading=False,
        has_summary=False,
        policy=policy({"messages": 5}, {"messages": 1}),
    )
    assert plan.reason is Reason.BELOW_TRIGGER
    assert not plan.compacts
    assert plan.cutoff == plan.start == 0
    assert plan.message_count_after == plan.message_count_before == 4


def test_six_messages_archive_all_but_the_last_two() -> None:
    messages = turns(6)
    plan = plan_compaction(
        messages,
        [10, 11, 12, 13, 14, 15],
        leading=False,
        has_summary=False,
        policy=policy({"messages": 6}, {"messages": 2}),
    )
    assert plan.reason is Reason.COMPACTED
    assert plan.compacts
    assert (plan.start, plan.cutoff) == (0, 4)
    assert plan.message_count_before == 6
    assert plan.tokens_before == 75 + REPLY_PRIMING
    # A new summary of the smallest budget (what it replaces is small) and the two kept.
    assert plan.message_count_after == 3
    assert plan.summary_budget == MIN_SUMMARY_BUDGET
    assert plan.tokens_after == MIN_SUMMARY_BUDGET + 14 + 15 + REPLY_PRIMING


def test_six_messages_with_system_message_keep_it_pinned() -> None:
    messages = [system_message(), *turns(5)]
    plan = plan_compaction(
        messages,
        [7, 10, 11, 12, 13, 14],
        leading=True,
        has_summary=False,
        policy=policy({"messages": 6}, {"messages": 2}),
    )
    assert plan.compacts
    assert (plan.start, plan.cutoff) == (1, 4)
    assert messages[plan.start : plan.cutoff] == messages[1:4]
    assert plan.message_count_after == 4
    assert plan.tokens_after == 7 + MIN_SUMMARY_BUDGET + 13 + 14 + REPLY_PRIMING


def test_both_trigger_keys_must_be_reached() -> None:
    trigger = Trigger(messages=4, tokens=100)
    assert not trigger.reached(4, 99)
    assert not trigger.reached(3, 100)
    assert not trigger.reached(3, 99)
    assert trigger.reached(4, 100)
    assert trigger.reached(40, 1000)

    rule = policy({"messages": 5, "tokens": 100}, {"messages": 1})
    many_small = plan_compaction(turns(6), [5] * 6, leading=False, has_summary=False, policy=rule)
    few_large = plan_compaction(turns(4), [200] * 4, leading=False, has_summary=False, policy=rule)
    both = plan_compaction(turns(5), [30] * 5, leading=False, has_summary=False, policy=rule)
    assert many_small.reason is Reason.BELOW_TRIGGER
    assert few_large.reason is Reason.BELOW_TRIGGER
    assert both.reason is Reason.COMPACTED


def test_thresholds_are_inclusive() -> None:
    assert Trigger(messages=5).reached(5, 0)
    assert not Trigger(messages=5).reached(4, 10**9)
    assert Trigger(tokens=100).reached(1, 100)
    assert not Trigger(tokens=100).reached(10**6, 99)

    rule = policy({"tokens": 100}, {"messages": 1})
    # context_tokens adds the reply priming to the messages' own counts.
    exactly = [40, 100 - REPLY_PRIMING - 40]
    one_below = [40, 100 - REPLY_PRIMING - 41]
    at = plan_compaction(turns(2), exactly, leading=False, has_summary=False, policy=rule)
    below = plan_compaction(turns(2), one_below, leading=False, has_summary=False, policy=rule)
    assert at.tokens_before == 100
    assert at.reason is Reason.COMPACTED
    assert below.tokens_before == 99
    assert below.reason is Reason.BELOW_TRIGGER


def test_a_trigger_without_keys_never_fires() -> None:
    assert not Trigger().reached(10**6, 10**9)


def test_the_ceiling_is_exceeded_only_above_it() -> None:
    rule = parse_policy({"messages": 50}, {"messages": 2}, 100)
    assert not rule.over(1, 100)
    assert rule.over(1, 101)
    at = plan_compaction(
        turns(2), [40, 100 - REPLY_PRIMING - 40], leading=False, has_summary=False, policy=rule
    )
    assert at.tokens_before == 100
    assert at.reason is Reason.BELOW_TRIGGER


# --- retention -------------------------------------------------------------------------


def test_message_retention_keeps_the_last_n_but_never_goes_before_start() -> None:
    assert retention_cutoff([1] * 10, start=1, keep=Keep(messages=3)) == 7
    assert retention_cutoff([1] * 10, start=1, keep=Keep(messages=9)) == 1
    assert retention_cutoff([1] * 10, start=2, keep=Keep(messages=50)) == 2


def test_token_retention_keeps_whole_messages_newest_first() -> None:
    tokens = [50, 40, 30, 20, 10]
    assert retention_cutoff(tokens, start=0, keep=Keep(tokens=35)) == 3
    # The budget is inclusive: 10 + 20 fits in 30 exactly, one token less does not.
    assert retention_cutoff(tokens, start=0, keep=Keep(tokens=30)) == 3
    assert retention_cutoff(tokens, start=0, keep=Keep(tokens=29)) == 4
    assert retention_cutoff(tokens, start=0, keep=Keep(tokens=60)) == 2
    # A message that does not fit stops the walk: nothing older is kept past it.
    assert retention_cutoff([1, 100, 1], start=0, keep=Keep(tokens=50)) == 2


def test_token_retention_always_keeps_the_newest_message() -> None:
    assert retention_cutoff([5, 5, 100], start=0, keep=Keep(tokens=10)) == 2
    assert retention_cutoff([5, 5, 100], start=2, keep=Keep(tokens=10)) == 2


def test_token_retention_never_goes_before_start() -> None:
    assert retention_cutoff([1, 1, 1, 1], start=2, keep=Keep(tokens=100)) == 2


def test_a_layout_pins_the_leading_message_then_the_summary_then_the_blocks() -> None:
    parts = (Part(LEADING, 5), Part(SUMMARY, 7), Part("facts", 3))
    layout = ContextLayout(pinned=parts, body_seqs=(4, 9, 10), body_tokens=(1, 2, 3))
    assert (layout.leading, layout.summary_tokens, layout.blocks) == (True, 7, parts[2:])
    assert layout.message_count == 6
    assert layout.token_count == 5 + 7 + 3 + 6 + REPLY_PRIMING
    # The body's seqs need not be consecutive: a range names the first and the last.
    assert layout.body_range(2) == SeqRange(4, 9)
    assert layout.body_range(0) is None
    assert 9 in SeqRange(4, 9) and 10 not in SeqRange(4, 9)
    # Archiving all but the newest message behind a 20-token summary.
    assert layout.compacted(summary_tokens=20, kept=1) == (4, 5 + 20 + 3 + 3 + REPLY_PRIMING)
    with pytest.raises(ValueError, match="out of order"):
        ContextLayout(pinned=(Part(SUMMARY, 7), Part(LEADING, 5)))
    with pytest.raises(ValueError, match="out of order"):
        ContextLayout(pinned=(Part(LEADING, 5), Part(LEADING, 5)))


def test_the_plan_names_the_archived_seqs_however_the_body_is_numbered() -> None:
    # A replaced system prompt stays in the transcript: the active body skips its seq.
    messages = turns(6)
    layout = ContextLayout(
        pinned=(Part(LEADING, 7),), body_seqs=(1, 2, 4, 5, 6, 7), body_tokens=(10,) * 6
    )
    plan = plan_layout(layout, messages, policy=policy({"messages": 6}, {"messages": 2}))
    assert plan.compacts
    assert (plan.archive, plan.kept) == (SeqRange(1, 5), 2)
    with pytest.raises(ValueError, match="body messages"):
        plan_layout(layout, messages[:5], policy=policy({"messages": 6}, {"messages": 2}))


def test_system_message_and_summary_are_never_archived() -> None:
    pinned = [system_message(), summary()]
    messages = [*pinned, *turns(8)]
    tokens = [500, 300, *[10] * 8]
    plan = plan_compaction(
        messages,
        tokens,
        leading=True,
        has_summary=True,
        policy=policy({"messages": 6}, {"messages": 1}),
    )
    assert plan.compacts
    assert plan.start == 2
    archived = messages[plan.start : plan.cutoff]
    assert all(message is not pinned[0] and message is not pinned[1] for message in archived)
    assert plan.cutoff == 9
    # Pinned system message, a new summary the size of the old one plus half of what it
    # archives, one kept message.
    assert plan.message_count_after == 3
    assert plan.summary_budget == 300 + 7 * 10 // 2
    assert plan.tokens_after == 500 + plan.summary_budget + 10 + REPLY_PRIMING


def test_the_facts_block_is_pinned_after_the_summary() -> None:
    block = user_message("Key facts (kept beside the summary; pinned first):\n- a: b")
    pinned = [system_message(), summary(), block]
    messages = [*pinned, *turns(8)]
    tokens = [500, 300, 40, *[10] * 8]
    plan = plan_compaction(
        messages,
        tokens,
        leading=True,
        has_summary=True,
        has_facts=True,
        policy=policy({"messages": 6}, {"messages": 1}),
    )
    assert plan.compacts and plan.start == 3 and plan.cutoff == 10
    assert all(message not in pinned for message in messages[plan.start : plan.cutoff])
    # The block stays at its size: system, the new summary, the block, one kept message.
    assert plan.message_count_after == 4
    assert plan.summary_budget == 300 + 7 * 10 // 2
    assert plan.tokens_after == 500 + plan.summary_budget + 40 + 10 + REPLY_PRIMING


def test_a_facts_block_without_a_summary_is_pinned_too() -> None:
    block = user_message("Key facts (kept beside the summary; pinned first):\n- a: b")
    messages = [block, *turns(6)]
    plan = plan_compaction(
        messages,
        [40, *[10] * 6],
        leading=False,
        has_summary=False,
        has_facts=True,
        policy=policy({"messages": 6}, {"messages": 2}),
    )
    assert plan.compacts and plan.start == 1 and plan.cutoff == 5
    assert plan.message_count_after == 1 + 1 + 2  # the new summary, the block, two kept
    assert plan.tokens_after == plan.summary_budget + 40 + 20 + REPLY_PRIMING


# --- tool boundary ---------------------------------------------------------------------


def test_pair_tool_results_pairs_each_result_with_its_request() -> None:
    messages = [
        user_message("weather?"),
        assistant_calls("call-1", "call-2"),
        tool_result("call-1"),
        tool_result("call-2"),
        tool_result("nobody"),
        {"role": "tool", "content": "no id at all"},
        user_message("thanks"),
    ]
    assert pair_tool_results(messages) == {2: 1, 3: 1, 4: None, 5: None}


def test_repeated_ids_pair_with_the_nearest_earlier_request() -> None:
    messages = [
        tool_result("call_1"),
        assistant_calls("call_1"),
        tool_result("call_1"),
        user_message("again"),
        assistant_calls("call_1"),
        tool_result("call_1"),
        user_message("thanks"),
    ]
    assert pair_tool_results(messages) == {0: None, 2: 1, 5: 4}
    assert safe_cutoff(messages, start=0, candidate=5) == 4
    assert safe_cutoff(messages, start=0, candidate=2) == 1
    assert safe_cutoff(messages, start=0, candidate=3) == 3


def test_every_cutoff_inside_parallel_results_moves_back_to_the_request() -> None:
    call_ids = tuple(f"call-{i}" for i in range(10))
    messages = [
        system_message(),
        user_message("check ten cities"),
        assistant_calls(*call_ids),
        *[tool_result(call_id) for call_id in call_ids],
        user_message("which is cooler?"),
        assistant_message("Delhi"),
    ]
    request = 2
    for candidate in range(request + 1, request + 1 + len(call_ids)):
        assert safe_cutoff(messages, start=1, candidate=candidate) == request, candidate
    assert safe_cutoff(messages, start=1, candidate=request) == request
    assert safe_cutoff(messages, start=1, candidate=13) == 13


def test_results_in_reverse_order_still_move_back() -> None:
    messages = [
        user_message("go"),
        assistant_calls("a", "b", "c"),
        tool_result("c"),
        tool_result("b"),
        tool_result("a"),
        user_message("next"),
    ]
    for candidate in (2, 3, 4):
        assert safe_cutoff(messages, start=0, candidate=candidate) == 1


# After a request for "a" and one for "b" (at 1 and 2), their results in this order, then a
# user message: wherever the cutoff starts, it moves back until no result in the tail lacks
# its request, which takes it to 1.
MOVING_BACK = [
    # Moving back to the request of "b" brings the result of "a" into the tail, whose
    # request is earlier still.
    (("b", "a"), 3),
    (("b", "a"), 2),
    # Cutting at "b"'s result moves back to its request at 2, which puts the result of
    # "a" (index 3) in the tail, so the cutoff moves back again to 1.
    (("a", "b"), 4),
]


@pytest.mark.parametrize(("results", "candidate"), MOVING_BACK)
def test_moving_back_repeats_until_stable(results: tuple[str, str], candidate: int) -> None:
    messages = [
        user_message("go"),
        assistant_calls("a"),
        assistant_calls("b"),
        *map(tool_result, results),
        user_message("next"),
    ]
    assert safe_cutoff(messages, start=0, candidate=candidate) == 1


def test_the_cutoff_never_moves_before_start() -> None:
    messages = [system_message(), assistant_calls("a"), tool_result("a"), user_message("next")]
    assert safe_cutoff(messages, start=1, candidate=2) == 1
    assert safe_cutoff(messages, start=1, candidate=0) == 1


def test_orphaned_results_are_skipped_forward() -> None:
    messages = [
        user_message("old conversation"),
        assistant_message("old answer"),
        tool_result("unknown-1"),
        tool_result("unknown-2"),
        user_message("continue"),
    ]
    assert safe_cutoff(messages, start=0, candidate=2) == 4
    assert safe_cutoff(messages, start=0, candidate=3) == 4


def test_skipping_orphans_never_archives_the_newest_message() -> None:
    messages = [
        user_message("old"),
        assistant_message("answer"),
        tool_result("unknown-1"),
        tool_result("unknown-2"),
    ]
    assert safe_cutoff(messages, start=0, candidate=2) == 3


def test_results_of_a_pinned_request_count_as_orphans() -> None:
    messages = [
        system_message(),
        assistant_calls("a"),
        tool_result("a"),
        tool_result("a"),
        user_message("go"),
    ]
    assert safe_cutoff(messages, start=2, candidate=2) == 4


def test_orphans_behind_a_kept_request_are_not_skipped() -> None:
    messages = [
        user_message("old"),
        assistant_calls("a"),
        tool_result("unknown"),
        tool_result("a"),
        user_message("next"),
    ]
    # The cutoff moves back to the request of "a"; the orphan between stays in the tail.
    assert safe_cutoff(messages, start=0, candidate=2) == 1


def test_safe_cutoff_handles_long_conversations_in_linear_time() -> None:
    call_ids = tuple(f"call-{i}" for i in range(20_000))
    messages = [
        user_message("go"),
        assistant_calls(*call_ids),
        *map(tool_result, call_ids),
        user_message("x"),
    ]
    assert safe_cutoff(messages, start=0, candidate=10_000) == 1


# --- the plan --------------------------------------------------------------------------


def test_newest_message_over_the_trigger_still_compacts_as_far_as_it_can() -> None:
    messages = [system_message(), *turns(5)]
    tokens = [10, 20, 20, 20, 20, 150]
    rule = policy({"tokens": 100}, {"tokens": 50})
    plan = plan_compaction(messages, tokens, leading=True, has_summary=False, policy=rule)
    # The newest message alone (150) is over the trigger: everything before it goes.
    assert plan.reason is Reason.COMPACTED
    assert (plan.start, plan.cutoff) == (1, 5)
    assert plan.over_trigger
    assert plan.tokens_after == 10 + MIN_SUMMARY_BUDGET + 150 + REPLY_PRIMING


def test_keep_is_the_most_kept_when_it_would_leave_the_context_at_the_trigger() -> None:
    messages = [system_message(), *turns(20)]
    tokens = [10, *[100] * 20]
    rule = policy({"tokens": 1000}, {"messages": 10})
    plan = plan_compaction(messages, tokens, leading=True, has_summary=False, policy=rule)
    # Keeping 10 would leave 10 + budget + 1000 tokens: at the trigger. The plan keeps
    # fewer, so the result lands at half the trigger (500), summary budget included.
    assert plan.compacts and not plan.over_trigger
    assert plan.summary_budget == 1000 // 2 // 2
    assert plan.tokens_after <= 500
    assert plan.cutoff == 19  # 10 + 250 + 200 + 3 fits; three kept messages would not
    one_more = 10 + plan.summary_budget + 300 + REPLY_PRIMING
    assert one_more > 500


def test_keep_is_honoured_when_it_leaves_the_context_below_the_trigger() -> None:
    messages = [system_message(), *turns(20)]
    tokens = [10, *[30] * 20]
    rule = policy({"tokens": 600}, {"messages": 10})
    plan = plan_compaction(messages, tokens, leading=True, has_summary=False, policy=rule)
    assert plan.compacts and not plan.over_trigger
    assert plan.cutoff == 11
    assert 300 < plan.tokens_after < 600  # over the target, but the "keep" landing keeps


def target(messages: list[Message], tokens: list[int], rule: Policy, **options: Any) -> Sent:
    """The forced plan with the "target" landing (the default) unless ``sizing`` says."""
    options.setdefault("sizing", Sizing())
    return plan_compaction(
        messages, tokens, leading=True, has_summary=False, policy=rule, force=True, **options
    )


def test_the_target_landing_keeps_fewer_than_keep_to_land_at_the_target() -> None:
    messages = [system_message(), *turns(20)]
    rule = policy({"tokens": 600}, {"messages": 10})
    plan = target(messages, [10, *[20] * 20], rule)
    # Keeping 10 leaves 10 + 100 + 200 + 3 = 313, keeping 9 10 + 110 + 180 + 3 = 303: over
    # the target of 300 (the summary's budget grows with what is archived). 8 land.
    assert plan.compacts and plan.kept == 8 and plan.tokens_after == 10 + 120 + 160 + 3
    lighter = target(messages, [10, *[19] * 20], rule)
    # 10 + 95 + 190 + 3 = 298 lands: all 10 are kept.
    assert lighter.cutoff == 11 and lighter.tokens_after == 298


def test_the_target_landing_keeps_all_of_keep_when_no_cut_lands() -> None:
    messages = [system_message(), *turns(6)]
    rule = policy({"tokens": 600}, {"messages": 2})
    plan = target(messages, [400, *[20] * 6], rule)
    # The system message alone is over the target of 300: keeping fewer than 2 would not
    # land either, so both stay.
    assert plan.compacts and plan.cutoff == 5 and not plan.over_trigger


def test_a_message_trigger_lands_at_the_target_with_the_target_landing() -> None:
    messages = [system_message(), *turns(12)]
    rule = policy({"messages": 12}, {"messages": 6})
    plan = target(messages, [10] * 13, rule)
    # The target is 6 messages: the system message, the summary and 4 kept.
    assert plan.message_count_after == 6 and plan.kept == 4


def test_keeping_fewer_never_splits_a_tool_round() -> None:
    messages = [
        system_message(),
        *turns(6),
        assistant_calls("a", "b"),
        tool_result("a"),
        tool_result("b"),
    ]
    tokens = [10, *[100] * 6, 100, 100, 100]
    rule = policy({"tokens": 600}, {"messages": 5})
    plan = plan_compaction(messages, tokens, leading=True, has_summary=False, policy=rule)
    # The newest message is a result: its round (request and both results) stays whole,
    # although the result (10 + 150 + 300 + 3) is then over the target of 300.
    assert plan.cutoff == 7
    assert plan.tokens_after == 463
    assert not plan.over_trigger


def test_keeping_fewer_keeps_as_many_as_land_at_the_target() -> None:
    messages = [system_message(), *turns(10)]
    tokens = [10, *[50] * 7, 800, 20, 20]
    rule = policy({"tokens": 1000}, {"messages": 3})
    plan = plan_compaction(messages, tokens, leading=True, has_summary=False, policy=rule)
    # Keeping 3 (800, 20, 20) leaves 10 + 175 + 840 + 3: at the trigger. Dropping the 800
    # lands at 10 + 250 + 40 + 3 = 303, below the target of 500: the two newest are kept,
    # not just the newest one.
    assert plan.compacts and not plan.over_trigger
    assert plan.cutoff == 9
    assert plan.tokens_after == 10 + 250 + 20 + 20 + REPLY_PRIMING


def test_keeping_fewer_never_cuts_inside_an_earlier_tool_round() -> None:
    tool_round = [assistant_calls("a", "b"), tool_result("a"), tool_result("b")]
    messages = [
        system_message(),
        user_message("look both up"),
        *tool_round,
        user_message("next"),
        assistant_message("done"),
    ]
    tokens = [10, 400, 10, 400, 10, 10, 10]
    rule = policy({"tokens": 600}, {"messages": 4})
    plan = plan_compaction(messages, tokens, leading=True, has_summary=False, policy=rule)
    # Keeping 4 moves back to the request (2) and stays at the trigger. Cutting between the
    # results (4) would land at the target, but would keep "b" without its request: the
    # first cutoff that lands is after the whole round.
    assert plan.compacts and not plan.over_trigger
    assert plan.cutoff == 5
    assert tail_is_valid(messages, plan.cutoff)


def test_max_context_tokens_compacts_and_keeps_fewer_below_it() -> None:
    messages = [system_message(), *turns(10)]
    tokens = [10, *[100] * 10]
    rule = parse_policy({"messages": 50}, {"messages": 8}, 600)
    plan = plan_compaction(messages, tokens, leading=True, has_summary=False, policy=rule)
    # Below the message trigger, but above the ceiling: it compacts, and keeps fewer than 8
    # so that it lands at half the ceiling (300), summary budget (150) included.
    assert plan.compacts and not plan.over_trigger
    assert plan.summary_budget == 150
    assert plan.cutoff == 10
    assert plan.tokens_after == 10 + 150 + 100 + REPLY_PRIMING


def test_summary_budget() -> None:
    def budget(previous: int, archived: int, goal: int | None = None) -> int:
        return summary_budget(
            previous_tokens=previous, archived_tokens=archived, max_tokens=1024, goal_tokens=goal
        )

    # The old summary plus half of what is archived: less than what it replaces, room to grow.
    assert budget(0, 400) == 200
    assert budget(300, 100) == 350
    # Within 3/4 of the hard cap and half the goal, never below 32.
    assert budget(700, 400) == 768
    assert budget(0, 10_000, goal=600) == 300
    assert budget(0, 10) == 32


def test_a_summary_of_the_budgeted_size_is_smaller_than_what_it_replaces() -> None:
    # The old summary is a context message: 218 tokens, 14 of them framing.
    messages = [summary(), *turns(8)]
    tokens = [218, *[25] * 8]
    sizing = Sizing(summary_overhead=14)
    rule = policy({"messages": 8}, {"messages": 3})
    plan = plan_compaction(
        messages, tokens, leading=False, has_summary=True, policy=rule, sizing=sizing
    )
    archived = sum(tokens[plan.start : plan.cutoff])
    assert plan.summary_budget == 218 - 14 + archived // 2
    assert plan.summary_budget + 14 < 218 + archived


def test_a_trigger_within_a_ratio_needs_one_unit_that_far_below() -> None:
    trigger = Trigger(messages=10, tokens=1000)
    assert trigger.within(0.5, 20, 500)
    assert trigger.within(0.5, 5, 5000)
    assert not trigger.within(0.5, 6, 501)


def test_a_message_trigger_must_leave_room_for_keep_and_every_pinned_message() -> None:
    # System message, summary, facts block and 3 kept: 6 messages reach a trigger of 6.
    with pytest.raises(PolicyError, match=r"Keep at most 2 messages") as caught:
        parse_policy({"messages": 6}, {"messages": 3})
    assert caught.value.field == "keep"
    assert str(caught.value) == KEEP_LEAVES_NO_ROOM.format(keep=3, trigger=6, most=2)
    assert parse_policy({"messages": 6}, {"messages": 2}).keep.messages == 2
    with pytest.raises(PolicyError, match=r"Keep at most 0 messages"):
        parse_policy({"messages": 4}, {"messages": 1})


def facts_block() -> Message:
    return user_message("Key facts (kept beside the summary; pinned first):\n- a: b")


def test_with_a_facts_block_a_compaction_keeps_all_of_keep_when_the_trigger_allows() -> None:
    pinned = [system_message(), summary(), facts_block()]
    messages = [*pinned, *turns(8)]
    plan = plan_compaction(
        messages,
        [50, 60, 40, *[10] * 8],
        leading=True,
        has_summary=True,
        has_facts=True,
        policy=policy({"messages": 7}, {"messages": 3}),
    )
    assert plan.compacts and not plan.over_trigger
    assert (plan.start, plan.cutoff) == (3, 8)
    # System message, the new summary, the block, and the three messages keep asks for.
    assert plan.message_count_after == 3 + 3


@settings(max_examples=200, deadline=None)
@given(keep=st.integers(1, 12), trigger=st.integers(2, 30), extra=st.integers(0, 8))
def test_every_accepted_message_policy_keeps_all_of_keep_beside_every_pinned_message(
    keep: int, trigger: int, extra: int
) -> None:
    try:
        rule = policy({"messages": trigger}, {"messages": keep})
    except PolicyError:
        # Refused only when the pinned three and the kept tail would reach the trigger.
        assert keep + 3 >= trigger
        return
    messages = [system_message(), summary(), facts_block(), *turns(trigger - 3 + extra)]
    plan = plan_compaction(
        messages,
        [10] * len(messages),
        leading=True,
        has_summary=True,
        has_facts=True,
        policy=rule,
    )
    assert plan.compacts and not plan.over_trigger
    assert plan.cutoff == len(messages) - keep
    assert plan.message_count_after == 3 + keep


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "100"])
def test_max_context_tokens_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(PolicyError, match="max_context_tokens must be a positive integer") as e:
        parse_policy({"tokens": 100}, {"tokens": 50}, value)
    assert e.value.field == "max_context_tokens"


def test_force_skips_the_trigger_but_respects_tool_boundaries() -> None:
    messages = [
        system_message(),
        user_message("weather?"),
        assistant_calls("a", "b"),
        tool_result("a"),
        tool_result("b"),
    ]
    rule = policy({"messages": 50}, {"messages": 2})
    unforced = plan_compaction(messages, [5] * 5, leading=True, has_summary=False, policy=rule)
    forced = plan_compaction(
        messages, [5] * 5, leading=True, has_summary=False, policy=rule, force=True
    )
    assert unforced.reason is Reason.BELOW_TRIGGER
    assert forced.reason is Reason.COMPACTED
    assert (forced.start, forced.cutoff) == (1, 2)


def test_force_with_nothing_before_the_tail_does_nothing() -> None:
    messages = [system_message(), assistant_calls("a"), tool_result("a")]
    plan = plan_compaction(
        messages,
        [5, 5, 5],
        leading=True,
        has_summary=False,
        policy=policy({"messages": 50}, {"messages": 1}),
        force=True,
    )
    assert plan.reason is Reason.NOTHING_TO_SUMMARIZE
    assert plan.cutoff == plan.start == 1


def test_a_conversation_of_pinned_messages_only_has_nothing_to_summarize() -> None:
    plan = plan_compaction(
        [system_message(), summary()],
        [5, 5],
        leading=True,
        has_summary=True,
        policy=policy({"messages": 5}, {"messages": 1}),
        force=True,
    )
    assert plan.reason is Reason.NOTHING_TO_SUMMARIZE


def test_plan_rejects_token_counts_of_another_length() -> None:
    with pytest.raises(ValueError, match="token counts"):
        plan_compaction(
            turns(3),
            [1, 1],
            leading=False,
            has_summary=False,
            policy=policy({"messages": 5}, {"messages": 1}),
        )


def test_reason_values_are_stable() -> None:
    assert {reason.value for reason in Reason} == {
        "below_trigger",
        "nothing_to_summarize",
        "no_gain",
        "in_progress",
        "conflict",
        "dry_run",
        "deferred",
        "queued",
        "compacted",
        "rebuilt",
        "reverted",
        "summarizer_error",
        "summary_truncated",
        "error",
        "interrupted",
        "no_payoff",
    }
    assert Reason.COMPACTED == "compacted"


# --- parsing ---------------------------------------------------------------------------


def test_parse_accepts_the_documented_forms() -> None:
    assert parse_trigger({"messages": 20}) == Trigger(messages=20)
    assert parse_trigger({"tokens": 8000}) == Trigger(tokens=8000)
    assert parse_trigger({"messages": 20, "tokens": 8000}) == Trigger(messages=20, tokens=8000)
    assert parse_keep({"messages": 6}) == Keep(messages=6)
    assert parse_keep({"tokens": 2000}) == Keep(tokens=2000)
    rule = parse_policy({"messages": 20, "tokens": 8000}, {"tokens": 2000})
    assert rule == Policy(trigger=Trigger(messages=20, tokens=8000), keep=Keep(tokens=2000))
    # Different units never conflict: 50 kept messages may well fit under 8000 tokens.
    assert parse_policy({"tokens": 8000}, {"messages": 50}).keep == Keep(messages=50)

    assert parse_trigger({"tokens": 5}) == Trigger(tokens=5)


@pytest.mark.parametrize("value", [None, [], "messages", 20, ("messages", 20)])
def test_parse_rejects_non_objects(value: object) -> None:
    with pytest.raises(PolicyError) as trigger_error:
        parse_trigger(value)
    with pytest.raises(PolicyError) as keep_error:
        parse_keep(value)
    assert trigger_error.value.field == "trigger"
    assert str(trigger_error.value) == NOT_AN_OBJECT.format(field="trigger")
    assert keep_error.value.field == "keep"
    assert str(keep_error.value) == NOT_AN_OBJECT.format(field="keep")


@pytest.mark.parametrize("value", [0, -1, True, False, "20", 2.0, 1.5, [20], {"n": 1}])
@pytest.mark.parametrize("unit", ["messages", "tokens"])
def test_parse_rejects_amounts_that_are_not_positive_integers(value: object, unit: str) -> None:
    for field, parse in (("trigger", parse_trigger), ("keep", parse_keep)):
        with pytest.raises(PolicyError) as error:
            parse({unit: value})
        assert error.value.field == field
        assert str(error.value) == NOT_POSITIVE_INT.format(field=field, unit=unit, value=value)


def test_parse_rejects_unknown_keys() -> None:
    with pytest.raises(PolicyError) as error:
        parse_trigger({"messages": 5, "minutes": 3, "Tokens": 1})
    assert error.value.field == "trigger"
    assert str(error.value) == UNKNOWN_KEYS.format(field="trigger", keys="Tokens, minutes")
    with pytest.raises(PolicyError) as error:
        parse_keep({"message": 5})
    assert error.value.field == "keep"


@pytest.mark.parametrize("value", [{}, {"messages": None}, {"messages": None, "tokens": None}])
def test_parse_rejects_an_empty_trigger(value: dict[str, Any]) -> None:
    with pytest.raises(PolicyError) as error:
        parse_trigger(value)
    assert error.value.field == "trigger"
    assert str(error.value) == TRIGGER_EMPTY


@pytest.mark.parametrize("value", [{}, {"messages": 2, "tokens": 100}, {"tokens": None}])
def test_parse_rejects_keep_without_exactly_one_unit(value: dict[str, Any]) -> None:
    with pytest.raises(PolicyError) as error:
        parse_keep(value)
    assert error.value.field == "keep"
    assert str(error.value) == KEEP_NOT_ONE_UNIT


@pytest.mark.parametrize(
    ("trigger", "keep", "unit", "kept", "limit"),
    [
        ({"messages": 5}, {"messages": 5}, "messages", 5, 5),
        ({"messages": 5}, {"messages": 9}, "messages", 9, 5),
        ({"messages": 20, "tokens": 1000}, {"tokens": 1000}, "tokens", 1000, 1000),
    ],
)
def test_parse_policy_rejects_keep_not_below_trigger(
    trigger: dict[str, int], keep: dict[str, int], unit: str, kept: int, limit: int
) -> None:
    with pytest.raises(PolicyError) as error:
        parse_policy(trigger, keep)
    assert error.value.field == "keep"
    assert str(error.value) == KEEP_NOT_BELOW_TRIGGER.format(unit=unit, keep=kept, trigger=limit)


def test_parse_policy_parses_plain_amounts_once_and_refuses_every_time() -> None:
    # Every append asks for its policy: one made of plain amounts is parsed once. True and
    # 1.0 equal 1 as keys go, and must still be refused after 1 was accepted.
    policy = parse_policy({"messages": 20}, {"messages": 1}, 1)
    assert parse_policy({"messages": 20}, {"messages": 1}, 1) is policy
    assert policy == Policy(
        trigger=Trigger(messages=20), keep=Keep(messages=1), max_context_tokens=1
    )
    refused = [
        (({"messages": 20}, {"messages": True}, 1), "keep.messages must be a positive integer"),
        (({"messages": 20}, {"messages": 1.0}, 1), "keep.messages must be a positive integer"),
        (({"messages": 20}, {"messages": 1}, True), "max_context_tokens must be a positive"),
        (({"messages": 20}, {"messages": 20}, None), "must be less than trigger.messages"),
    ]
    for _ in range(2):
        for args, message in refused:
            with pytest.raises(PolicyError) as error:
                parse_policy(*args)
            assert message in str(error.value)


def test_policy_errors_are_value_errors_and_checked_by_the_dataclasses_too() -> None:
    assert issubclass(PolicyError, ValueError)
    with pytest.raises(PolicyError):
        Keep(messages=1, tokens=1)
    with pytest.raises(PolicyError):
        Keep()
    with pytest.raises(PolicyError):
        Trigger(messages=0)
    with pytest.raises(PolicyError):
        Policy(trigger=Trigger(messages=3), keep=Keep(messages=3))


# --- incoming messages -----------------------------------------------------------------


def test_incoming_messages_make_a_context_below_the_trigger_due() -> None:
    messages = [system_message(), *turns(10)]
    tokens = [10, *[20] * 10]  # 213 tokens as sent, 11 messages
    for trigger in ({"tokens": 300}, {"messages": 12}):
        rule = policy(trigger, {"messages": 4})
        alone = plan_compaction(messages, tokens, leading=True, has_summary=False, policy=rule)
        assert alone.reason is Reason.BELOW_TRIGGER
        plan = plan_compaction(
            messages, tokens, leading=True, has_summary=False, policy=rule, incoming=(1, 90)
        )
        assert plan.compacts and (plan.start, plan.cutoff) == (1, 7)
        # The plan's sizes are the stored context's; the incoming messages are not in them.
        assert (plan.message_count_before, plan.tokens_before) == (11, 213)


def test_keep_is_kept_unless_the_incoming_messages_would_reach_the_trigger() -> None:
    messages = [system_message(), *turns(20)]
    tokens = [10, *[20] * 10, 180, 180, 180, 130, 50, *[10] * 5]
    rule = policy({"tokens": 1000}, {"messages": 10})
    alone = plan_compaction(
        messages, tokens, leading=True, has_summary=False, policy=rule, force=True
    )
    # Keeping 10 leaves 10 + 100 + 770 + 3 = 883: below the trigger, so all of keep stays.
    assert alone.cutoff == 11 and alone.tokens_after == 883 and not alone.over_trigger
    plan = plan_compaction(
        messages, tokens, leading=True, has_summary=False, policy=rule, incoming=(2, 120)
    )
    # 883 + 120 reaches it: fewer are kept, so that the context with the incoming 120 lands
    # at half the trigger: 10 + 250 + 100 + 3 + 120 = 483 (seven kept: 613).
    assert plan.compacts and not plan.over_trigger
    assert plan.cutoff == 15 and plan.tokens_after == 363
    assert (plan.message_count_after, plan.kept) == (8, 6)


def test_a_message_trigger_counts_the_incoming_messages_too() -> None:
    messages = [system_message(), *turns(8)]
    rule = policy({"messages": 8}, {"messages": 4})
    alone = plan_compaction(messages, [10] * 9, leading=True, has_summary=False, policy=rule)
    assert alone.cutoff == 5 and alone.message_count_after == 6
    plan = plan_compaction(
        messages, [10] * 9, leading=True, has_summary=False, policy=rule, incoming=(2, 30)
    )
    # Six and the two incoming reach the trigger; keeping two would make six, over half of
    # it with them: only the newest stays.
    assert plan.compacts and not plan.over_trigger
    assert plan.cutoff == 8 and plan.message_count_after == 3


def test_incoming_messages_let_a_forced_plan_keep_fewer_than_keep() -> None:
    messages = [system_message(), *turns(4)]
    rule = policy({"tokens": 300}, {"messages": 10})
    tokens = [10, 60, 60, 60, 60]
    alone = plan_compaction(
        messages, tokens, leading=True, has_summary=False, policy=rule, force=True
    )
    # Retention keeps every message: a forced compaction alone has nothing to do ...
    assert alone.reason is Reason.NOTHING_TO_SUMMARIZE
    plan = plan_compaction(
        messages, tokens, leading=True, has_summary=False, policy=rule, force=True, incoming=(1, 60)
    )
    # ... but 253 + 60 reaches the trigger: it compacts, keeping fewer (none of the cuts
    # lands at 150 with the 60, so only the newest message stays).
    assert plan.compacts and plan.cutoff == 4 and not plan.over_trigger
    assert plan.tokens_after == 10 + 75 + 60 + REPLY_PRIMING


def test_over_trigger_counts_the_incoming_messages() -> None:
    messages = [system_message(), *turns(5)]
    tokens = [10, 20, 20, 20, 20, 150]
    rule = policy({"tokens": 300}, {"tokens": 50})
    alone = plan_compaction(
        messages, tokens, leading=True, has_summary=False, policy=rule, force=True
    )
    assert alone.compacts and not alone.over_trigger
    plan = plan_compaction(
        messages, tokens, leading=True, has_summary=False, policy=rule, incoming=(1, 100)
    )
    # 10 + 40 + 150 + 3 = 203, and the incoming 100 reach 300: as far as it can, and over.
    assert plan.compacts and plan.cutoff == 5 and plan.over_trigger
    assert plan.tokens_after == 203


# --- properties over random conversations ---------------------------------------------

CALL_IDS = [f"call_{i}" for i in range(6)]


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[Message], list[int], bool, bool]:
    leading = draw(st.booleans())
    has_summary = draw(st.booleans())
    messages: list[Message] = []
    if leading:
        messages.append(system_message())
    if has_summary:
        messages.append(summary())
    kinds = st.sampled_from(["user", "assistant", "tools", "tools", "orphan"])
    for kind in draw(st.lists(kinds, min_size=1, max_size=25)):
        if kind == "user":
            messages.append(user_message())
        elif kind == "assistant":
            messages.append(assistant_message())
        elif kind == "orphan":
            messages.append(tool_result(draw(st.sampled_from(["lost_1", "lost_2", *CALL_IDS]))))
        else:
            # Ids are unique within one message but come back in later messages.
            call_ids = draw(
                st.lists(st.sampled_from(CALL_IDS), min_size=1, max_size=5, unique=True)
            )
            messages.append(assistant_calls(*call_ids))
            messages.extend(tool_result(call_id) for call_id in draw(st.permutations(call_ids)))
    tokens = draw(st.lists(st.integers(1, 300), min_size=len(messages), max_size=len(messages)))
    return messages, tokens, leading, has_summary


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    if draw(st.booleans()):
        keep = Keep(messages=draw(st.integers(1, 12)))
    else:
        keep = Keep(tokens=draw(st.integers(1, 1500)))
    units = draw(st.sampled_from([("messages",), ("tokens",), ("messages", "tokens")]))
    trigger = Trigger(
        messages=(
            draw(st.integers((keep.messages or 0) + PINNED_MAX + 1, 30))
            if "messages" in units
            else None
        ),
        tokens=draw(st.integers((keep.tokens or 0) + 1, 5000)) if "tokens" in units else None,
    )
    ceiling = draw(st.none() | st.integers(50, 6000))
    return Policy(trigger=trigger, keep=keep, max_context_tokens=ceiling)


def _goal(rule: Policy) -> int | None:
    limits = (rule.trigger.tokens, rule.max_context_tokens)
    goals = [limit // 2 for limit in limits if limit]
    return min(goals) if goals else None


def requests_in_full_list(messages: list[Message]) -> dict[int, int]:
    """Reference pairing, quadratic on purpose: nearest earlier request with the id."""
    pairs = {}
    for index, message in enumerate(messages):
        if message["role"] != "tool":
            continue
        for earlier in range(index - 1, -1, -1):
            calls = messages[earlier].get("tool_calls") or ()
            if any(call["id"] == message["tool_call_id"] for call in calls):
                pairs[index] = earlier
                break
    return pairs


def tail_is_valid(messages: list[Message], cutoff: int) -> bool:
    pairs = requests_in_full_list(messages)
    return all(pairs[index] >= cutoff for index in range(cutoff, len(messages)) if index in pairs)


def assert_compacting_plan(
    plan: Any,
    messages: list[Message],
    tokens: list[int],
    leading: bool,
    rule: Policy,
    incoming: tuple[int, int] = (0, 0),
) -> None:
    """What a plan that compacts holds to: its sizes, and retention against the trigger
    (judged with the ``incoming`` messages)."""
    start, count, ceiling = plan.start, len(messages), rule.max_context_tokens
    count_after = plan.message_count_after + incoming[0]
    tokens_after = plan.tokens_after + incoming[1]
    has_summary = start > int(leading)
    # The newest message and its tool round are the least a compaction keeps.
    newest_round = safe_cutoff(messages, start=start, candidate=count - 1)
    assert start < plan.cutoff <= newest_round
    assert plan.message_count_after == int(leading) + 1 + count - plan.cutoff
    assert plan.summary_budget == summary_budget(
        previous_tokens=tokens[int(leading)] if has_summary else 0,
        archived_tokens=sum(tokens[start : plan.cutoff]),
        max_tokens=1024,
        goal_tokens=_goal(rule),
    )
    assert plan.tokens_after == (
        sum(tokens[: int(leading)])
        + plan.summary_budget
        + sum(tokens[plan.cutoff :])
        + REPLY_PRIMING
    )
    over = rule.trigger.reached(count_after, tokens_after) or (
        ceiling is not None and tokens_after > ceiling
    )
    assert plan.over_trigger == over
    # Never more kept than retention asks for (tool rounds aside) ...
    preferred = safe_cutoff(
        messages, start=start, candidate=retention_cutoff(tokens, start=start, keep=rule.keep)
    )
    assert plan.cutoff >= min(preferred, newest_round)
    # ... and fewer only to get off the trigger: then as far as the target or the minimum.
    if plan.cutoff > max(preferred, start + 1) and plan.cutoff != newest_round:
        assert rule.trigger.within(0.5, count_after, tokens_after)
        assert ceiling is None or tokens_after <= ceiling // 2
    if over:
        assert plan.cutoff == newest_round


# Messages joining the context right after the compaction: none, or a chat turn's.
INCOMING = st.just((0, 0)) | st.tuples(st.integers(1, 3), st.integers(1, 600))


@settings(max_examples=400, deadline=None)
@given(conversation=conversations(), rule=policies(), force=st.booleans(), incoming=INCOMING)
def test_every_plan_keeps_tool_pairs_the_pinned_front_and_the_newest_message(
    conversation: tuple[list[Message], list[int], bool, bool],
    rule: Policy,
    force: bool,
    incoming: tuple[int, int],
) -> None:
    messages, tokens, leading, has_summary = conversation
    plan = plan_compaction(
        messages,
        tokens,
        leading=leading,
        has_summary=has_summary,
        policy=rule,
        force=force,
        incoming=incoming,
    )
    count = len(messages)
    start = int(leading) + int(has_summary)
    assert isinstance(plan.plan, Plan)
    assert plan.kept == count - plan.cutoff
    assert plan.start == start
    assert plan.message_count_before == count
    assert plan.tokens_before == sum(tokens) + REPLY_PRIMING
    assert start <= plan.cutoff <= count - 1
    assert tail_is_valid(messages, plan.cutoff)
    archived = messages[plan.start : plan.cutoff]
    assert all(message is not pinned for message in archived for pinned in messages[:start])
    if force:
        assert plan.reason in (Reason.COMPACTED, Reason.NOTHING_TO_SUMMARIZE)
    ceiling = rule.max_context_tokens
    if plan.compacts:
        assert_compacting_plan(plan, messages, tokens, leading, rule, incoming)
    if plan.reason is Reason.BELOW_TRIGGER:
        assert not force
        assert not rule.trigger.reached(count + incoming[0], plan.tokens_before + incoming[1])
        assert ceiling is None or plan.tokens_before + incoming[1] <= ceiling


@settings(max_examples=300, deadline=None)
@given(conversation=conversations())
def test_safe_cutoff_is_the_nearest_valid_cutoff(
    conversation: tuple[list[Message], list[int], bool, bool],
) -> None:
    messages, _, leading, has_summary = conversation
    start = int(leading) + int(has_summary)
    count = len(messages)
    reference = requests_in_full_list(messages)
    assert pair_tool_results(messages) == {
        index: reference.get(index) for index, m in enumerate(messages) if m["role"] == "tool"
    }
    for candidate in range(start, count):
        cutoff = safe_cutoff(messages, start=start, candidate=candidate)
        assert start <= cutoff <= count - 1
        assert tail_is_valid(messages, cutoff)
        if cutoff <= candidate:
            # Moved back no further than needed: every cutoff in between splits a pair.
            assert not any(tail_is_valid(messages, c) for c in range(cutoff + 1, candidate + 1))
        else:
            # Moved forward only over orphaned results, from a cutoff that was valid.
            assert tail_is_valid(messages, candidate)
            skipped = range(candidate, cutoff)
            assert all(messages[i]["role"] == "tool" for i in skipped)
            assert all(reference.get(i) is None or reference[i] < start for i in skipped)
