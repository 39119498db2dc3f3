"""How many identifiers of the archived messages survive compaction: in the summary alone,
and in the summary with the key facts beside it; and what the facts block costs.

Every agent run of the data is replayed through ctxsum's service layer with the offline
summarizer (deterministic, no network; ``--summary fixed``: bench.vs_langchain's fixed
summary, with the facts the offline backend finds): the system message leads, every other
message is appended on its own and ``conversation_compact`` runs after each append (trigger
12 messages, keep 6). After every compaction that commits, the identifiers of all the
messages archived so far (``ctxsum.coverage``'s e-mail addresses, amounts, dates and
identifiers: ids, codes, order numbers) are looked for in

- the active summary's text;
- the summary and every stored fact the conversation sees (key and value);
- the summary and the facts block as the context carries it (its budget, ``facts_budget``);
- the context without the block: the summary and the kept messages;
- the context: the summary, the facts block and the kept messages.

Reported by compaction number (1st, 2nd, … of a conversation): identifiers found and the
share present in each, summed over conversations. The cost: after every append (a model
call), the tokens of the facts block, and its share of the context from message 20 on.

    python -m bench.facts_recall [--limit N] [--summary offline|fixed]
        [--facts-max-tokens N] [--database-url URL] [--output PATH]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, run_facts, write_json
from tests.support.run_info import load_average
from tests.support.shared import DATA_DIR

KINDS = ("email", "amount", "date", "identifier")
SIDES = (
    "summary",
    "summary + facts",
    "summary + facts block",
    "context without block",
    "context",
)
AGENT_RUNS = "agent_trajectories.jsonl.gz"
TRIGGER = {"messages": 12}
KEEP = {"messages": 6}
REPORTED = (1, 2, 3, 5, 10, 15, 20)
SUMMARIZERS = {
    "offline": "ctxsum.summarizers.offline.OfflineSummarizer",
    "fixed": "bench.fixed_summary.FixedFactsSummarizer",
}
# The block's share of the context is reported from this message on.
LATE_CALL = 20


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.facts_recall", description=__doc__)
    parser.add_argument("--limit", type=int, default=None, help="at most N agent runs")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--summary", choices=sorted(SUMMARIZERS), default="offline")
    parser.add_argument("--facts-max-tokens", type=int, default=None, metavar="N")
    parser.add_argument(
        "--database-url", default=None, help="a database to use (default: a new SQLite file)"
    )
    parser.add_argument("--output", type=Path, default=None, metavar="PATH")
    return parser.parse_args(argv)


def setup(database_url: str | None, sqlite_dir: Path, args: argparse.Namespace) -> None:
    """The example project's settings on the benchmark's own database, with the summarizer
    ``args`` names and no automatic compaction."""
    import os

    from tests.support.replay_django import replay_database
    from tests.support.shared import use_tiktoken_cache

    use_tiktoken_cache()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django
    from django.conf import settings

    settings.DATABASES = {
        "default": replay_database(database_url=database_url, sqlite_dir=sqlite_dir)
    }
    settings.DEBUG = False
    settings.CTXSUM = {
        **(getattr(settings, "CTXSUM", None) or {}),
        "SUMMARIZER": SUMMARIZERS[args.summary],
        "AUTO_COMPACT": False,
        **(
            {"FACTS_MAX_TOKENS": args.facts_max_tokens} if args.facts_max_tokens is not None else {}
        ),
    }
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


class Tally:
    """Identifiers found and present, per side, by compaction number."""

    def __init__(self) -> None:
        self.found: dict[int, int] = defaultdict(int)
        self.present: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SIDES, 0))
        self.conversations: dict[int, int] = defaultdict(int)
        self.missing_examples: list[dict[str, Any]] = []
        # Per call: the facts block's tokens (0: none); from LATE_CALL on, the context's.
        self.blocks: list[int] = []
        self.late: list[tuple[int, int]] = []

    def call(self, number: int, context: Any) -> None:
        """Count what the facts block costs in the context of the ``number``-th call."""
        block = sum(part.tokens for part in context.layout.pinned if part.kind == "facts")
        self.blocks.append(block)
        if number >= LATE_CALL:
            self.late.append((block, context.token_count))

    def cost(self) -> dict[str, Any]:
        shown = sorted(block for block in self.blocks if block)
        late_context = sum(total for _, total in self.late)
        return {
            "calls": len(self.blocks),
            "calls_with_block": len(shown),
            "median_block_tokens": shown[len(shown) // 2] if shown else 0,
            "block_tokens": sum(shown),
            "late_block_share": sum(b for b, _ in self.late) / late_context
            if late_context
            else None,
        }

    def add(self, number: int, found: int, present: Mapping[str, int]) -> None:
        self.found[number] += found
        self.conversations[number] += 1
        for side in SIDES:
            self.present[number][side] += present[side]

    def share(self, numbers: Sequence[int], side: str) -> float | None:
        found = sum(self.found[number] for number in numbers)
        if not found:
            return None
        return sum(self.present[number][side] for number in numbers) / found

    def as_json(self) -> dict[str, Any]:
        numbers = sorted(self.found)
        return {
            "by_compaction": [
                {
                    "compaction": number,
                    "conversations": self.conversations[number],
                    "identifiers": self.found[number],
                    "present": self.present[number],
                    "share": {side: self.share([number], side) for side in SIDES},
                }
                for number in numbers
            ],
            "from_10th_on": {
                side: self.share([n for n in numbers if n >= 10], side) for side in SIDES
            },
            "all": {side: self.share(numbers, side) for side in SIDES},
            "missing_examples": self.missing_examples[:40],
            "cost": self.cost(),
        }


def measure(conversation: Any, summary: Any, context: Any) -> tuple[int, dict[str, int], list[str]]:
    """Identifiers of the messages archived under ``summary`` and its predecessors, and how
    many each side holds (``context``: the active one); with the ones the facts missed."""
    from ctxsum import coverage
    from ctxsum.facts.block import block_message, facts_visible
    from ctxsum.facts.lines import fact_line
    from ctxsum.models import Message

    archived = Message.objects.filter(conversation=conversation, summary__isnull=False).order_by(
        "seq"
    )
    texts = coverage.message_texts(row.as_openai() for row in archived)
    found = [(kind, text) for kind, text in coverage.facts_found(texts) if kind in KINDS]
    facts = list(facts_visible(conversation))
    stored = "\n".join(fact_line(fact.key, fact.value) for fact in facts)
    block = str(block_message(context.shown("facts"))["content"])
    kept = "\n".join(coverage.message_texts(context.body))
    holders = {
        "summary": summary.text,
        "summary + facts": f"{summary.text}\n{stored}",
        "summary + facts block": f"{summary.text}\n{block}",
        "context without block": f"{summary.text}\n{kept}",
        "context": f"{summary.text}\n{block}\n{kept}",
    }
    present: dict[str, int] = {}
    missed: list[str] = []
    for side, text in holders.items():
        checked = coverage.facts_checked(found, text)
        present[side] = sum(fact.present for fact in checked.facts)
        if side == "summary + facts":
            missed = [f"{fact.kind}:{fact.text}" for fact in checked.missing]
    return len(found), present, missed


def replay(record: Mapping[str, Any], owner: Any, tally: Tally) -> int:
    """Replay one agent run; returns its number of compactions."""
    from ctxsum.models import Summary
    from ctxsum.policy import Reason
    from ctxsum.services import conversation_compact, conversation_create, message_append

    messages = list(record["messages"])
    leading = messages[:1] if messages and messages[0].get("role") == "system" else []
    conversation = conversation_create(
        owner=owner,
        title=str(record.get("id", ""))[:200],
        trigger=TRIGGER,
        keep=KEEP,
        messages=[dict(message) for message in leading] or None,
    )
    number = 0
    for index, message in enumerate(messages[len(leading) :], start=len(leading)):
        message_append(conversation=conversation, messages=[dict(message)])
        result = conversation_compact(conversation=conversation)
        assert result.context is not None
        tally.call(index, result.context)
        if result.reason != Reason.COMPACTED:
            continue
        number += 1
        summary = Summary.objects.get(conversation=conversation, active=True)
        found, present, missed = measure(conversation, summary, result.context)
        tally.add(number, found, present)
        if missed and len(tally.missing_examples) < 40:
            tally.missing_examples.append(
                {"conversation": str(record.get("id")), "compaction": number, "missed": missed}
            )
    return number


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.common import bench_owner
    from tests.support.replay_data import iter_records

    owner = bench_owner("ctxsum-facts-recall")
    tally = Tally()
    started = time.perf_counter()
    runs = compactions = 0
    for _, record in iter_records(args.data_dir, (AGENT_RUNS,), limit=args.limit):
        compactions += replay(record, owner, tally)
        runs += 1
        if runs % 25 == 0:
            print(f"  {runs} runs, {compactions} compactions", file=sys.stderr)
    return {
        "runs": runs,
        "compactions": compactions,
        "seconds": round(time.perf_counter() - started, 1),
        **tally.as_json(),
    }


def report_lines(result: Mapping[str, Any]) -> list[str]:
    lines = [
        f"{result['runs']} agent runs, {result['compactions']} compactions",
        "compaction | runs | identifiers | " + " | ".join(SIDES),
    ]
    for row in result["by_compaction"]:
        if row["compaction"] in REPORTED:
            shares = " | ".join(f"{row['share'][side]:.1%}" for side in SIDES)
            lines.append(
                f"{row['compaction']} | {row['conversations']} | {row['identifiers']} | {shares}"
            )
    from_10 = " | ".join(
        "-" if result["from_10th_on"][side] is None else f"{result['from_10th_on'][side]:.1%}"
        for side in SIDES
    )
    lines.append(f"10th and later | | | {from_10}")
    cost = result["cost"]
    late = cost["late_block_share"]
    lines.append(
        f"facts block in {cost['calls_with_block']} of {cost['calls']} calls, median "
        f"{cost['median_block_tokens']} tokens, {cost['block_tokens']} in all; "
        f"from message {LATE_CALL} on {'-' if late is None else f'{late:.1%}'} of the context"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="ctxsum-facts-recall-") as sqlite_dir:
        setup(args.database_url, Path(sqlite_dir), args)
        report = {
            **run_facts(),
            "command": "python -m bench.facts_recall",
            "args": {
                name: str(value) if isinstance(value, Path) else value
                for name, value in vars(args).items()
            },
        }
        report["result"] = run(args)
        report["load_average_end"] = load_average()
    stamp = datetime.date.today().isoformat()
    output = args.output or RESULTS_DIR / f"facts-recall-{stamp}.json"
    write_json(report, output)
    print("\n".join(report_lines(report["result"])))
    print(f"written to {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
