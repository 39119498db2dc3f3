"""The frame of a benchmark command of docs/PERFORMANCE.md around what it measures:
``--plots-from`` (redraw the plots from a results file and exit), one process per database
(SQLite, then PostgreSQL), the fields every report carries, the results file in
bench/results/, the plots and the closing lines. Importing it does not configure Django."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, disposable_database, run_facts, setup_django, write_json
from tests.support.run_info import load_average

# A command's plots drawn from its report: the files written.
Draw = Callable[[dict[str, Any]], list[Path]]
# What a command prints of its report after the plots (each line indented).
Lines = Callable[[dict[str, Any]], list[str]]
# Options only the command itself reads: not passed on to the process of each database.
PARENT_ONLY = ("--no-postgres", "--no-plots")


def add_command_options(
    parser: argparse.ArgumentParser,
    *,
    default_database: str,
    per_database: bool = True,
    plots: bool = True,
) -> None:
    """The frame's options, in this order: ``--database-url`` (the PostgreSQL database to
    create, use and drop), ``--no-postgres`` (with ``per_database``), ``--no-plots`` (with
    ``plots``), ``--output``, ``--plots-from``, then the hidden ``--backend`` and ``--part``
    of the process of each database (with ``per_database``)."""
    parser.add_argument(
        "--database-url",
        default=default_database,
        help=f"PostgreSQL database to create, use and drop (default {default_database})",
    )
    if per_database:
        parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    if plots:
        parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--output", type=Path, default=None, metavar="PATH")
    parser.add_argument(
        "--plots-from",
        type=Path,
        default=None,
        metavar="JSON",
        help="only redraw the plot from a results file of this command",
    )
    if per_database:
        parser.add_argument("--backend", choices=("sqlite", "postgresql"), help=argparse.SUPPRESS)
        parser.add_argument("--part", type=Path, help=argparse.SUPPRESS)


def show_plots(draw: Draw, report: dict[str, Any]) -> None:
    """Draw the plots of ``report`` and print where each went."""
    for path in draw(report):
        print(f"  plot: {path}")


def redraw(draw: Draw, results: Path) -> int:
    """``--plots-from``: draw the plots again from a results file of the command; the exit
    status (0)."""
    show_plots(draw, json.loads(results.read_text(encoding="utf-8")))
    return 0


@dataclass
class Run:
    """One run of ``python -m bench.<benchmark> <argv>``: its clock and the facts taken
    when it starts (machine, commit, versions, load), then its report and results file."""

    benchmark: str
    argv: Sequence[str]
    started: float = field(default_factory=time.perf_counter)
    facts: dict[str, Any] = field(default_factory=run_facts)

    def report(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The command's own ``fields`` between what every report carries: the benchmark,
        the date, the command and the facts before them, the wall time and the load
        after."""
        return {
            "benchmark": self.benchmark,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python", "-m", f"bench.{self.benchmark}", *self.argv]),
            **self.facts,
            **fields,
            "wall_seconds": round(time.perf_counter() - self.started, 1),
            "load_average_end": load_average(),
        }

    def write(self, report: dict[str, Any], output: Path | None) -> Path:
        """Write ``report`` to ``output``, else to bench/results/<benchmark>-<date>.json
        (dashes for underscores); the file written."""
        name = f"{self.benchmark.replace('_', '-')}-{report['date'][:10]}.json"
        return write_json(report, output or RESULTS_DIR / name)

    def finish(
        self,
        fields: Mapping[str, Any],
        args: argparse.Namespace,
        *,
        draw: Draw,
        lines: Lines | None = None,
    ) -> int:
        """Write the report of ``fields`` to ``--output`` (else bench/results/), draw its
        plots (unless ``--no-plots``, where the command has it), print ``lines`` of it and
        where it went; the exit status (0)."""
        report = self.report(fields)
        output = self.write(report, args.output)
        if not getattr(args, "no_plots", False):
            show_plots(draw, report)
        for line in lines(report) if lines else []:
            print(f"  {line}")
        print(f"  results: {output}  ({report['wall_seconds']} s)")
        return 0


def run_part(module: str, backend: str, argv: Sequence[str], part: Path) -> dict[str, Any]:
    """Run ``python -m <module> <argv> --backend <backend> --part <part>`` (one database
    per process: Django is set up once) and read the JSON it wrote."""
    command = [sys.executable, "-m", module, *argv, "--backend", backend, "--part", str(part)]
    subprocess.run(command, check=True)
    result: dict[str, Any] = json.loads(part.read_text(encoding="utf-8"))
    return result


def parts_run(benchmark: str, argv: Sequence[str], *, no_postgres: bool) -> dict[str, Any]:
    """Every database's part of the results, SQLite then PostgreSQL (unless
    ``no_postgres``), each from ``python -m bench.<benchmark>`` in a process of its own."""
    forwarded = [arg for arg in argv if arg not in PARENT_ONLY]
    backends = ["sqlite"] if no_postgres else ["sqlite", "postgresql"]
    with tempfile.TemporaryDirectory(prefix=f"ctxsum-{benchmark}-parts-") as tmp:
        return {
            name: run_part(f"bench.{benchmark}", name, forwarded, Path(tmp) / f"{name}.json")
            for name in backends
        }


@dataclass(frozen=True)
class Database:
    """The database of a ``--backend`` process: PostgreSQL's URL (``None`` for SQLite) and
    the folder of the SQLite file."""

    url: str | None
    sqlite_dir: Path


@contextlib.contextmanager
def backend_django(
    args: argparse.Namespace,
    *,
    prefix: str,
    sqlite_immediate: bool = False,
    ctxsum: dict[str, Any] | None = None,
) -> Iterator[Database]:
    """Django set up on the database of ``--backend`` for the block: PostgreSQL's
    ``--database-url``, created and dropped after (``disposable_database``), or a SQLite
    file in a temporary folder named ``prefix``…; its connections closed after the block.
    ``sqlite_immediate``: as ``setup_django``'s; ``ctxsum``: settings of the ``CTXSUM``
    dict beside those the benchmarks pin."""
    url = args.database_url if args.backend == "postgresql" else None
    with disposable_database(url), tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        database = Database(url=url, sqlite_dir=Path(tmp))
        # The conversations these commands build keep the same last messages at every size
        # (all of KEEP: LANDING "keep"), as their sections in docs/PERFORMANCE.md describe.
        setup_django(
            database_url=url,
            sqlite_dir=database.sqlite_dir,
            sqlite_immediate=sqlite_immediate,
            ctxsum={"LANDING": "keep", **(ctxsum or {})},
        )
        try:
            yield database
        finally:
            from django.db import connections

            connections.close_all()


def per_database_main(
    benchmark: str,
    argv: Sequence[str] | None,
    *,
    parse_args: Callable[[Sequence[str]], argparse.Namespace],
    backend_main: Callable[[argparse.Namespace], int],
    draw: Draw,
    options: Sequence[str] = (),
    lines: Lines | None = None,
) -> int:
    """``main()`` of a command measured on each database in a process of its own:
    ``--backend`` (such a process) runs ``backend_main``; ``--plots-from`` only redraws;
    otherwise the parts (``parts_run``), then the report, with the values of ``options``
    (attribute names of the parsed arguments) and the parts as ``backends``, its file, its
    plots and ``lines`` (``Run.finish``). ``argv``: the arguments, else ``sys.argv``'s."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.backend:
        return backend_main(args)
    if args.plots_from is not None:
        return redraw(draw, args.plots_from)
    run = Run(benchmark, argv)
    parts = parts_run(benchmark, argv, no_postgres=args.no_postgres)
    fields = {name: getattr(args, name) for name in options}
    return run.finish({**fields, "backends": parts}, args, draw=draw, lines=lines)
