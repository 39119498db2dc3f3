"""The replay's report: ``build_report`` turns merged ReplayStats into the JSON sections
(counts, distributions, histograms), ``format_report`` turns a whole report into the text
printed at the end of a run. Both are pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ctxsum.policy import Reason
from tests.support.replay_stats import (
    REDUCTION_FROM_TURN,
    ReplayStats,
    distribution,
    percentile,
)


def _counter(values: Counter) -> dict[str, int]:
    return {str(key): values[key] for key in sorted(values)}


def _spread(values: Counter) -> dict[str, Any]:
    """A histogram of whole numbers with its n, min, median and max."""
    keys = sorted(values)
    if not keys:
        return {"n": 0}
    flat = [key for key in keys for _ in range(values[key])]
    return {
        "n": len(flat),
        "min": keys[0],
        "median": percentile(flat, 50),
        "max": keys[-1],
        "histogram": _counter(values),
    }


def _with_p5(values: Sequence[float]) -> dict[str, Any]:
    return {**distribution(values), "p5": round(percentile(values, 5), 4) if values else None}


def build_report(stats: ReplayStats) -> dict[str, Any]:
    """The measured part of the JSON report, in the order it is written."""
    return {
        **_counts(stats),
        **_reductions(stats),
        **_queries(stats),
        "timings_ms": _timings(stats),
    }


def _counts(stats: ReplayStats) -> dict[str, Any]:
    return {
        "conversations": stats.conversations,
        "messages": stats.messages,
        "compactions": stats.compactions,
        "files": {name: dict(values) for name, values in stats.per_file.items()},
        "compaction_calls": _counter(stats.reasons),
        "no_gain_skips": stats.reasons[Reason.NO_GAIN],
        "no_gain": {
            "skips": stats.reasons[Reason.NO_GAIN],
            "after_a_summarizer_call": stats.no_gain_summarized,
            "range_rejected_before_not_sent": stats.no_gain_not_sent,
        },
        "compactions_over_trigger": stats.over_trigger[Reason.COMPACTED],
        "compact_calls_over_trigger": _counter(+stats.over_trigger),
        "summarizer_calls": stats.summarizer_calls,
        "summary_budget": distribution(stats.summary_budgets, digits=1),
        "summary_to_replaced_tokens": distribution(stats.summary_ratios),
        "archived_per_compaction": distribution(stats.archived, digits=2),
        "max_context_messages": stats.max_active_messages,
    }


def _reductions(stats: ReplayStats) -> dict[str, Any]:
    return {
        "token_reduction": {
            "from_turn": REDUCTION_FROM_TURN,
            "definition": "1 - active context tokens / tokens of every original message so far "
            "(both as one request: per-message overhead and reply priming included)",
            **_with_p5(stats.reductions),
        },
        "token_reduction_by_file": {
            name: _with_p5(values) for name, values in sorted(stats.reductions_by_file.items())
        },
        "steps_with_context_over_full_history": stats.context_over_history,
        "erasure_probes": stats.erasure_probes,
        "erasure_probe_compactions": stats.erasure_probe_compactions,
        "final_token_reduction": _with_p5(stats.final_reductions),
    }


def _queries(stats: ReplayStats) -> dict[str, Any]:
    return {
        "queries_per_compaction": {
            **distribution(stats.compaction_queries, digits=2),
            "by_kind": {
                key: _counter(value) for key, value in sorted(stats.queries_by_kind.items())
            },
            "by_messages_archived": {
                str(archived): _counter(values)
                for archived, values in sorted(stats.queries_by_archived.items())
            },
        },
        "message_updates_per_compaction": _counter(Counter(stats.compaction_message_updates)),
        "queries_per_skipped_compact_call": {
            reason: _spread(values) for reason, values in sorted(stats.skipped_queries.items())
        },
        "queries_per_append": _spread(stats.append_queries),
    }


def _timings(stats: ReplayStats) -> dict[str, Any]:
    return {
        "append": distribution(stats.append_seconds, scale=1000, digits=3),
        "compaction": distribution(stats.compaction_seconds, scale=1000, digits=3),
        "skipped_compact_call": {
            reason: distribution(values, scale=1000, digits=3)
            for reason, values in sorted(stats.skipped_seconds.items())
        },
        "invariant_checks_total_s": round(stats.check_seconds, 2),
        "invariant_checked_steps": stats.checked_steps,
    }


def format_report(report: Mapping[str, Any]) -> str:
    """The report as the lines a run prints: what ran, what the compact calls did, the
    token reduction, the queries, the timings."""
    return "\n".join(
        [
            *_run_lines(report),
            *_compaction_lines(report),
            *_reduction_lines(report),
            *_query_lines(report),
            *_timing_lines(report),
        ]
    )


def _run_lines(report: Mapping[str, Any]) -> list[str]:
    database, policy = report["database"], report["policy"]
    return [
        f"ctxsum replay {report['date']}  ({database['vendor']} "
        f"{database['version']}, {report['machine']['cpus']} CPUs, "
        f"check={'on' if report['check'] else 'off'})",
        f"  policy: trigger {policy['trigger']}, keep {policy['keep']}, "
        f"summarizer {policy['summarizer'].rsplit('.', 1)[-1]}",
        f"  conversations {report['conversations']}, messages {report['messages']}, "
        f"compactions {report['compactions']}, summaries {report['summaries']}",
    ]


def _compaction_lines(report: Mapping[str, Any]) -> list[str]:
    no_gain, budget = report["no_gain"], report["summary_budget"]
    ratio, archived = report["summary_to_replaced_tokens"], report["archived_per_compaction"]
    return [
        f"  compact calls by reason: {report['compaction_calls']}",
        f"  no_gain skips: {no_gain['skips']} ({no_gain['after_a_summarizer_call']} after a "
        f"summarizer call, {no_gain['range_rejected_before_not_sent']} not sent again); "
        f"summarizer calls {report['summarizer_calls']}",
        f"  compactions that ended over the trigger: {report['compactions_over_trigger']}; "
        f"compact calls over the trigger by reason: {report['compact_calls_over_trigger']}",
        f"  summary budget (tokens): median {budget.get('median')}, min {budget.get('min')}, "
        f"max {budget.get('max')}; summary / replaced tokens: median {ratio.get('median')}, "
        f"p95 {ratio.get('p95')}, max {ratio.get('max')}",
        f"  messages archived per compaction: median {archived.get('median')}, max "
        f"{archived.get('max')}; largest context sent: "
        f"{report['max_context_messages']} messages",
    ]


def _reduction_lines(report: Mapping[str, Any]) -> list[str]:
    reduction = report["token_reduction"]
    lines = [
        f"  token reduction at turn >= {reduction['from_turn']} ({reduction['n']} steps): "
        f"median {reduction.get('median')}, p95 {reduction.get('p95')}, "
        f"p5 {reduction.get('p5')}, mean {reduction.get('mean')}",
    ]
    lines += [
        f"    {name or 'all'}: median {values.get('median')}, p95 {values.get('p95')}, "
        f"p5 {values.get('p5')} ({values['n']} steps)"
        for name, values in report["token_reduction_by_file"].items()
    ]
    lines.append(
        f"  steps (any turn) whose context costs more than the full history: "
        f"{report['steps_with_context_over_full_history']}"
    )
    return lines


def _query_lines(report: Mapping[str, Any]) -> list[str]:
    queries = report["queries_per_compaction"]
    skipped = {
        reason: values.get("histogram")
        for reason, values in report["queries_per_skipped_compact_call"].items()
    }
    lines = [
        f"  queries per compaction: min {queries.get('min')}, median {queries.get('median')}, "
        f"max {queries.get('max')}; by kind: {queries['by_kind']}",
        f"  queries per compaction by messages archived: {queries['by_messages_archived']}",
        f"  UPDATEs of ctxsum_message per compaction: {report['message_updates_per_compaction']}",
        f"  queries per compact call that compacted nothing, by reason: {skipped}",
        f"  queries per append: {report['queries_per_append'].get('histogram')}",
    ]
    lines += [
        f"  one-shot compaction archiving {row['archived']:>4} messages: {row['queries']} "
        f"queries ({row['kind']}), {row['message_updates']} UPDATE of ctxsum_message, "
        f"{row['ms']} ms"
        for row in report.get("query_scaling", [])
    ]
    return lines


def _timing_lines(report: Mapping[str, Any]) -> list[str]:
    timings = report["timings_ms"]
    rows = [(name, timings[name]) for name in ("append", "compaction")]
    rows += [
        (f"compact call ({reason})", value)
        for reason, value in timings["skipped_compact_call"].items()
    ]
    lines = [
        f"  {name} ms: median {value.get('median')}, mean {value.get('mean')}, "
        f"p95 {value.get('p95')}, max {value.get('max')} (n={value['n']})"
        for name, value in rows
    ]
    lines.append(
        f"  wall {report['wall_seconds']} s (replay {report['replay_seconds']} s, "
        f"invariant checks {timings['invariant_checks_total_s']} s after "
        f"{timings.get('invariant_checked_steps', 0)} steps, "
        f"{report.get('erasure_probes', 0)} erasure probes, setup+migrate "
        f"{report['setup_seconds']} s); process CPU {report['cpu_seconds']} s; load average "
        f"{report['load_average_at_start']} at start, {report['load_average_at_end']} at end"
    )
    return lines
