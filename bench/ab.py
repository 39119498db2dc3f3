"""One benchmark on two checkouts of ctxsum, in turn: before and after a change.

    python -m bench.ab --before DIR --after DIR [--runs N] [--metric PATTERN ...] \\
        -- bench.throughput --processes 1 4 8 --rounds 1

Runs ``python -m <module> <args> --output <file>`` with each checkout's own ``.venv`` and in
that checkout's folder, ``--runs`` times each, alternating which side goes first (before,
after; after, before; …) so that a change in the machine's load falls on both. Every numeric
value of a result file is named by its path of keys (``backends/sqlite/processes/1/median/
append``); ``--metric`` picks them with shell-style patterns. The report gives, for each
picked value, its median over the runs on each side and the ratio after / before, and
is written as JSON beside the table (docs/PERFORMANCE.md, "Before and after the redesign").
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import write_json
from tests.support.run_info import load_average, machine_info


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    parser.add_argument("--before", type=Path, required=True, help="the checkout before")
    parser.add_argument("--after", type=Path, required=True, help="the checkout after")
    parser.add_argument("--runs", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument(
        "--metric", action="append", default=[], help="pattern of the values to report"
    )
    parser.add_argument("--output", type=Path, required=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        parser.error("give the benchmark after --, e.g. -- bench.throughput --rounds 1")
    split = argv.index("--")
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("no benchmark module after --")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args, command


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every number in a result, with its path of keys (list items by their index)."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path, float(value)
        return
    else:
        return
    for key, item in items:
        yield from leaves(item, f"{path}/{key}" if path else str(key))


def run_side(checkout: Path, command: list[str], output: Path) -> dict[str, Any]:
    """One run of the benchmark in ``checkout``; its result file, read."""
    module, *rest = command
    argv = [str(checkout / ".venv" / "bin" / "python"), "-m", module, *rest, "--output"]
    started = time.monotonic()
    subprocess.run([*argv, str(output)], cwd=checkout, check=True)
    print(f"  {checkout}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    result: dict[str, Any] = json.loads(output.read_text())
    return result


def compare(runs: dict[str, list[dict[str, Any]]], patterns: list[str]) -> dict[str, Any]:
    """Per picked value: each side's runs, their medians, and the ratio after / before."""
    picked: dict[str, dict[str, list[float]]] = {}
    for side, results in runs.items():
        for result in results:
            for path, number in leaves(result):
                if any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns):
                    picked.setdefault(path, {}).setdefault(side, []).append(number)
    table = {}
    for path, sides in sorted(picked.items()):
        before = statistics.median(sides.get("before", [float("nan")]))
        after = statistics.median(sides.get("after", [float("nan")]))
        ratio = round(after / before, 4) if before else None
        table[path] = {**sides, "median_before": before, "median_after": after, "ratio": ratio}
    return table


def main(argv: Sequence[str] | None = None) -> int:
    args, command = parse_args(argv)
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="ctxsum-ab-") as scratch:
        for number in range(args.runs):
            order = ["before", "after"] if number % 2 == 0 else ["after", "before"]
            for side in order:
                output = Path(scratch) / f"{side}-{number}.json"
                runs[side].append(run_side(sides[side], command, output))
    table = compare(runs, args.metric or ["*"])
    report = {
        "benchmark": "ab",
        "command": command,
        "runs": args.runs,
        "machine": machine_info(),
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "commits": {side: runs[side][0].get("git", {}).get("commit") for side in runs},
        "values": table,
    }
    write_json(report, args.output)
    for path, row in table.items():
        print(
            f"{path}: before {row['median_before']:,.4g}, after {row['median_after']:,.4g}, "
            f"after/before {row['ratio']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
