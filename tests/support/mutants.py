"""Hand-made mutants of the compaction service, the policy, the validation rules, the
redaction and the facts block, and a runner that applies them one at a time and runs the
tests that should notice.

    python -m tests.support.mutants [--list] [--only NAME]... [--jobs N] [--output results.json]
    python -m tests.support.mutants --check

Each mutant replaces one exact snippet of a source file with a small, plausible mistake (a
``>=`` that became ``>``, a guard that went missing). The snippet must occur exactly once in
its file, or the run fails before anything is changed: the table is checked against the
code every time, so it cannot drift from it silently. ``--check`` does only that (in well
under a second) and exits 1 naming every mutant whose snippet no longer matches; it is a
step of ``.ci/run``, and so is the whole run.

The run copies the checkout once per worker (``--jobs``, default the number of CPUs: what
git tracks or would track, into a temporary folder) and never changes the checkout itself.
A worker takes the next mutant, rewrites its file in its own copy, runs the mutant's pytest
selection there in a subprocess (``-x -q -p no:cacheprovider``, no bytecode written), and
restores the file in a ``finally`` with its original bytes and timestamps, which are
compared afterwards. A selection that fails kills the mutant; one that passes lets it
survive. A mutant no test can tell from the code (an equivalent one) carries a ``survives``
note saying why, and docs/testing.md explains it: it is expected to survive, and is
reported as stale if a test ever kills it.

Mutants marked ``postgres`` need DATABASE_URL to name a PostgreSQL database (they exercise
row locks) and are skipped without it; each worker's pytest then makes a test database of
its own (the name with ``_mutants<worker>`` appended). The others run on SQLite with
DATABASE_URL removed from their environment. Before the mutants, every distinct selection
runs once on the unmutated code, in the same pool of workers: a selection that fails there
would kill every mutant, and stops the run. The exit status is 1 when a mutant survived
unexpectedly or a note is stale, else 0; ``--output`` writes the results as JSON.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support.shared import REPO_ROOT, use_tiktoken_cache

POLICY = "ctxsum/policy.py"
LAYOUT = "ctxsum/layout.py"
VALIDATION = "ctxsum/validation.py"
MESSAGE_SCHEMA = "ctxsum/message_schema.py"
COMPACTION = "ctxsum/services/compaction.py"
LEASES = "ctxsum/services/leases.py"
ROW_LEASE = "ctxsum/services/row_lease.py"
REDACTION = "ctxsum/services/redaction.py"
FACT_BLOCK = "ctxsum/facts/block.py"
REBUILD = "ctxsum/services/rebuild.py"
CHAT_SERVICES = "ctxsum/chat/services.py"
POP = "ctxsum/services/pop.py"

POLICY_TESTS = ("tests/test_policy.py",)
VALIDATION_TESTS = ("tests/test_validation.py",)
COMPACTION_TESTS = ("tests/test_compaction.py", "tests/test_compaction_api.py")
RACE_TESTS = ("tests/test_races.py",)
LEASE_TESTS = ("tests/test_compaction_concurrency.py",)
PINNED_TESTS = ("tests/test_pinned.py",)
BOUNDARY_TESTS = ("tests/test_boundaries.py",)
ERASURE_TESTS = ("tests/test_erasure.py",)
CROSSING_TESTS = ("tests/test_chat_crossing.py",)

PYTEST_OPTIONS = ("-x", "-q", "-p", "no:cacheprovider")
# A mutant that makes a loop endless is killed by the clock.
DEFAULT_TIMEOUT = 900


@dataclass(frozen=True)
class Mutant:
    """One mistake: ``before`` (found exactly once in ``path``) becomes ``after``.

    ``survives`` says why no test can kill it (it is equivalent: no input tells it from the
    code); such a mutant is expected to survive, and being killed means the note is stale.
    """

    name: str
    path: str
    before: str
    after: str
    tests: tuple[str, ...]
    postgres: bool = False
    survives: str = ""

    @property
    def database(self) -> str:
        return "postgresql" if self.postgres else "sqlite"


MUTANTS: tuple[Mutant, ...] = (
    # --- policy: trigger, retention, pinned front ----------------------------------------
    Mutant(
        "trigger-tokens-exclusive",
        POLICY,
        "return self.tokens is None or token_count >= self.tokens",
        "return self.tokens is None or token_count > self.tokens",
        POLICY_TESTS,
    ),
    Mutant(
        "ceiling-inclusive",
        POLICY,
        "return ceiling is not None and token_count > ceiling",
        "return ceiling is not None and token_count >= ceiling",
        POLICY_TESTS,
    ),
    Mutant(
        "keep-may-equal-trigger",
        POLICY,
        "if kept is not None and limit is not None and kept >= limit:",
        "if kept is not None and limit is not None and kept > limit:",
        POLICY_TESTS,
    ),
    Mutant("pinned-max-without-facts", LAYOUT, "PINNED_MAX = 3", "PINNED_MAX = 2", POLICY_TESTS),
    Mutant(
        "retention-keeps-one-fewer",
        POLICY,
        "return max(start, count - keep.messages)",
        "return max(start, count - keep.messages + 1)",
        POLICY_TESTS,
    ),
    Mutant(
        "retention-tokens-exclusive",
        POLICY,
        "if cutoff < count and kept + cost > keep.tokens:",
        "if cutoff < count and kept + cost >= keep.tokens:",
        POLICY_TESTS,
    ),
    Mutant(
        "compacted-forgets-blocks",
        LAYOUT,
        "sizes = [*leading, summary_tokens, *blocks, *tail]",
        "sizes = [*leading, summary_tokens, *tail]",
        POLICY_TESTS,
    ),
    # --- policy: safe tool boundary ------------------------------------------------------
    Mutant(
        "tool-boundary-moves-back-once",
        POLICY,
        "while self.earliest_request[cutoff] < cutoff:",
        "if self.earliest_request[cutoff] < cutoff:",
        POLICY_TESTS,
    ),
    Mutant(
        "tool-boundary-pinned-request-kept",
        POLICY,
        "if request is not None and request >= self.start:\n                break",
        "if request is not None:\n                break",
        POLICY_TESTS,
    ),
    # --- policy: summary budget and keeping fewer ----------------------------------------
    Mutant(
        "budget-whole-cap",
        POLICY,
        "budget = min(max_tokens * 3 // 4, previous_tokens + archived_tokens // 2)",
        "budget = min(max_tokens, previous_tokens + archived_tokens // 2)",
        POLICY_TESTS,
    ),
    Mutant(
        "budget-whole-archived",
        POLICY,
        "budget = min(max_tokens * 3 // 4, previous_tokens + archived_tokens // 2)",
        "budget = min(max_tokens * 3 // 4, previous_tokens + archived_tokens)",
        POLICY_TESTS,
    ),
    Mutant(
        "budget-previous-with-framing",
        POLICY,
        "self.previous = max(0, previous - sizing.summary_overhead) if previous is not None else 0",
        "self.previous = max(0, previous) if previous is not None else 0",
        POLICY_TESTS,
    ),
    Mutant(
        "goal-larger-limit",
        POLICY,
        "return min(goals) if goals else None",
        "return max(goals) if goals else None",
        POLICY_TESTS,
    ),
    Mutant(
        "keep-fewer-skips-nearest",
        POLICY,
        "for candidate in range(cutoff + 1, last):",
        "for candidate in range(cutoff + 2, last):",
        POLICY_TESTS,
    ),
    Mutant(
        "keep-fewer-splits-tool-round",
        POLICY,
        "if boundaries.safe(candidate) == candidate:",
        "if boundaries.safe(candidate) >= 0:",
        POLICY_TESTS,
    ),
    Mutant(
        "keep-fewer-lands-at-ceiling",
        POLICY,
        "if ceiling is not None and tokens > int(ceiling * ratio):",
        "if ceiling is not None and tokens > ceiling:",
        POLICY_TESTS,
    ),
    Mutant(
        "force-obeys-trigger",
        POLICY,
        "if not force and not due:",
        "if not due:",
        POLICY_TESTS,
    ),
    Mutant(
        "incoming-ignored",
        POLICY,
        "return self.policy.over(count + self.incoming[0], tokens + self.incoming[1])",
        "return self.policy.over(count, tokens)",
        POLICY_TESTS,
    ),
    Mutant(
        "turn-reply-uncounted",
        CHAT_SERVICES,
        "incoming = (len(new) + 1, new_tokens + next(replies, 0))",
        "incoming = (len(new), new_tokens)",
        CROSSING_TESTS,
    ),
    # --- validation ----------------------------------------------------------------------
    Mutant(
        "text-limit-exclusive",
        VALIDATION,
        '"maxLength": (str, lambda value, limit: len(value) <= limit),',
        '"maxLength": (str, lambda value, limit: len(value) < limit),',
        VALIDATION_TESTS,
    ),
    Mutant(
        "message-size-inclusive",
        VALIDATION,
        "if size > max_bytes:",
        "if size >= max_bytes:",
        VALIDATION_TESTS,
    ),
    Mutant(
        "tool-result-id-unbounded",
        MESSAGE_SCHEMA,
        "ANSWERED_CALL: Schema = {\n    **ID,",
        "ANSWERED_CALL: Schema = {\n    **string(1),",
        VALIDATION_TESTS,
    ),
    Mutant(
        "tool-call-id-on-assistant",
        MESSAGE_SCHEMA,
        "tool_calls=nullable(TOOL_CALLS),",
        "tool_calls=nullable(TOOL_CALLS),\n    tool_call_id=nullable(ID),",
        VALIDATION_TESTS,
    ),
    Mutant(
        "tool-calls-on-tool-messages",
        MESSAGE_SCHEMA,
        '("role", "content", "tool_call_id"), tool_call_id=ANSWERED_CALL',
        '("role", "content", "tool_call_id"), tool_call_id=ANSWERED_CALL, '
        "tool_calls=nullable(TOOL_CALLS)",
        VALIDATION_TESTS,
    ),
    Mutant(
        "null-content-with-audio-refused",
        MESSAGE_SCHEMA,
        '    "audio": {"type": "object", "minProperties": 1},\n',
        "",
        VALIDATION_TESTS,
    ),
    Mutant(
        "call-ids-may-repeat",
        VALIDATION,
        'seen.add(call["id"])',
        'seen.discard(call["id"])',
        VALIDATION_TESTS,
    ),
    Mutant(
        "call-id-unbounded",
        MESSAGE_SCHEMA,
        '"id": ID,',
        '"id": string(1),',
        VALIDATION_TESTS,
    ),
    Mutant(
        "extras-not-nullable",
        MESSAGE_SCHEMA,
        '"refusal": nullable(string()),',
        '"refusal": string(),',
        VALIDATION_TESTS,
    ),
    # --- compaction: the commit's guards -------------------------------------------------
    Mutant(
        "lock-ignores-lease",
        ROW_LEASE,
        "locked = rows.select_for_update().filter(**{self.owner: token}).first()",
        "locked = rows.select_for_update().first()",
        COMPACTION_TESTS,
    ),
    Mutant(
        "lock-without-row-lock",
        ROW_LEASE,
        "locked = rows.select_for_update().filter(**{self.owner: token}).first()",
        "locked = rows.filter(**{self.owner: token}).first()",
        RACE_TESTS,
        postgres=True,
    ),
    Mutant(
        "active-summary-unchecked",
        COMPACTION,
        "    if not active_summary_is(locked, run.context.summary):\n        raise _Conflict\n",
        "",
        LEASE_TESTS,
        postgres=True,
    ),
    Mutant(
        "archive-counts-rows-stored-after-the-read",
        COMPACTION,
        "            pk__lte=max(row.pk for row in archived),\n",
        "",
        ("tests/test_pop.py",),
        postgres=True,
    ),
    Mutant(
        "pop-takes-back-what-a-summary-covered",
        POP,
        "    return None if covered.exists() else newest\n",
        "    return newest\n",
        ("tests/test_pop.py",),
    ),
    Mutant(
        "late-results-unchecked",
        COMPACTION,
        "    if call_ids and late_results.exists():\n        raise _Conflict\n",
        "",
        COMPACTION_TESTS,
    ),
    Mutant(
        "archive-includes-leading",
        COMPACTION,
        "            is_leading=False,\n",
        "",
        PINNED_TESTS,
    ),
    Mutant(
        "archive-count-only-more",
        COMPACTION,
        "if updated != len(archived):",
        "if updated > len(archived):",
        COMPACTION_TESTS,
    ),
    # --- compaction: counters, gain, leases, records -------------------------------------
    Mutant(
        "counters-keep-a-message",
        COMPACTION,
        "locked.active_message_count -= len(archived)",
        "locked.active_message_count -= len(archived) - 1",
        COMPACTION_TESTS,
    ),
    Mutant(
        "counters-keep-old-summary",
        COMPACTION,
        "locked.active_tokens += summary.token_count - old_summary_tokens - archived_tokens",
        "locked.active_tokens += summary.token_count - archived_tokens",
        COMPACTION_TESTS,
    ),
    Mutant(
        "commit-keeps-lease",
        COMPACTION,
        '    locked.lease_owner = ""\n',
        "",
        COMPACTION_TESTS,
    ),
    Mutant(
        "no-gain-when-equal-commits",
        COMPACTION,
        "if written.token_count >= replaced_tokens:",
        "if written.token_count > replaced_tokens:",
        COMPACTION_TESTS,
    ),
    Mutant(
        "no-gain-forgets-old-summary",
        COMPACTION,
        "    return replaced + (run.context.summary.token_count if run.context.summary else 0)",
        "    return replaced",
        COMPACTION_TESTS,
    ),
    Mutant(
        "no-gain-skips-grown-range",
        COMPACTION,
        "to_seq__gte=run.archived[-1].seq,",
        "to_seq__lte=run.archived[-1].seq,",
        COMPACTION_TESTS,
    ),
    Mutant(
        "no-gain-any-start",
        COMPACTION,
        "            from_seq=run.archived[0].seq,\n",
        "",
        COMPACTION_TESTS,
    ),
    Mutant(
        "conflict-keeps-lease",
        LEASES,
        "    if isinstance(error, WriteNothing | LeaseLost):\n"
        "        lease_release(conversation, token, db=db)\n",
        "    if isinstance(error, WriteNothing | LeaseLost):\n        pass\n",
        COMPACTION_TESTS,
    ),
    Mutant(
        "failure-keeps-lease",
        LEASES,
        "    elif isinstance(error, Exception):\n"
        "        lease_release(conversation, token, db=db)\n",
        "    elif isinstance(error, Exception):\n",
        COMPACTION_TESTS,
    ),
    Mutant(
        "failure-unrecorded",
        COMPACTION,
        "with leased(run.conversation, db=run.db, failed=partial(_failed, run))",
        "with leased(run.conversation, db=run.db)",
        COMPACTION_TESTS,
    ),
    Mutant(
        "nothing-to-summarize-unrecorded",
        COMPACTION,
        "RECORDED_SKIPS = (\n    Reason.NOTHING_TO_SUMMARIZE,\n",
        "RECORDED_SKIPS = (\n",
        COMPACTION_TESTS,
    ),
    Mutant(
        "payoff-skip-unrecorded",
        COMPACTION,
        "    Reason.NO_PAYOFF,\n)",
        ")",
        ("tests/test_payoff.py",),
    ),
    Mutant(
        "payoff-always-pays",
        POLICY,
        "return self.saved * PAYBACK_CALLS >= self.cost",
        "return True",
        ("tests/test_payoff.py",),
    ),
    Mutant(
        "landing-keeps-all-of-keep",
        POLICY,
        "if keeping and self.sizing.landing == KEEP_LANDING:",
        "if keeping:",
        POLICY_TESTS,
    ),
    Mutant(
        "below-trigger-reports-over",
        COMPACTION,
        "over_trigger=over and reason != Reason.BELOW_TRIGGER,",
        "over_trigger=over,",
        COMPACTION_TESTS,
        survives="equivalent: below the trigger, the context is never over it",
    ),
    Mutant(
        "over-trigger-from-estimate",
        COMPACTION,
        "over_trigger=run.over(context) if context else run.plan.over_trigger,",
        "over_trigger=run.plan.over_trigger,",
        COMPACTION_TESTS,
    ),
    Mutant(
        "record-without-row-lock",
        COMPACTION,
        "rows = Conversation.objects.using(db).select_for_update()",
        "rows = Conversation.objects.using(db)",
        RACE_TESTS,
        postgres=True,
    ),
    # --- redaction and the facts block: inclusive edges ----------------------------------
    Mutant(
        "redaction-skips-to-seq",
        REDACTION,
        "to_seq__gte=message.seq",
        "to_seq__gt=message.seq",
        BOUNDARY_TESTS,
    ),
    Mutant(
        "facts-budget-exclusive",
        FACT_BLOCK,
        "if used + fact.token_count <= limit:",
        "if used + fact.token_count < limit:",
        BOUNDARY_TESTS,
    ),
    # --- erasure (invariant f) ----------------------------------------------------------
    Mutant(
        "redaction-keeps-summary-text",
        REDACTION,
        "text=notice, token_count=size,",
        "token_count=size,",
        ERASURE_TESTS,
    ),
    Mutant(
        "archive-ignores-redaction",
        COMPACTION,
        "    as_read = Q(redacted_at__isnull=True)\n",
        "    as_read = Q()\n",
        ERASURE_TESTS,
    ),
    Mutant(
        "withheld-summary-carried-forward",
        COMPACTION,
        "if previous is None or not previous.covers_redacted:",
        "if True:",
        ERASURE_TESTS,
    ),
    Mutant(
        "withheld-since-snapshot-unseen",
        COMPACTION,
        "return found == ((expected.pk, expected.covers_redacted) if expected else None)",
        "return (found and found[0]) == (expected and expected.pk)",
        ERASURE_TESTS,
    ),
    Mutant(
        "rebuild-without-gain-guard",
        REBUILD,
        "    gain_check(written, replaced_tokens=stands_for)\n",
        "",
        ERASURE_TESTS,
    ),
)


# "expected": a survivor marked as equivalent; "stale": a mutant so marked that was killed.
STATUSES = ("killed", "survived", "expected", "stale", "skipped")


@dataclass
class Result:
    """What running one mutant's selection gave."""

    name: str
    path: str
    database: str
    status: str  # one of STATUSES
    seconds: float
    killed_by: str = ""
    summary: str = ""
    survives: str = ""
    tests: list[str] = field(default_factory=list)


class TableError(Exception):
    """The table does not match the code (a snippet is missing or ambiguous)."""


def check_table(mutants: Iterable[Mutant]) -> None:
    """Raise TableError unless every name is unique, every snippet occurs exactly once and
    every test file a selection names exists."""
    problems, names = [], set()
    for mutant in mutants:
        if mutant.name in names:
            problems.append(f"{mutant.name}: the name is used twice")
        names.add(mutant.name)
        count = (REPO_ROOT / mutant.path).read_text(encoding="utf-8").count(mutant.before)
        if count != 1:
            problems.append(f"{mutant.name}: the snippet occurs {count} times in {mutant.path}")
        if mutant.before == mutant.after:
            problems.append(f"{mutant.name}: the replacement changes nothing")
        for test in mutant.tests:
            if not (REPO_ROOT / test.split("::", 1)[0]).is_file():
                problems.append(f"{mutant.name}: its selection names {test}, which is gone")
    if problems:
        raise TableError("\n".join(problems))


def check(mutants: Sequence[Mutant]) -> int:
    """``--check``: 0 when the table matches the code, else 1 with every mismatch named."""
    try:
        check_table(mutants)
    except TableError as error:
        print(
            "The mutant table (tests/support/mutants.py) no longer matches the code; "
            "move each snippet below with the code it stands for:",
            file=sys.stderr,
        )
        print(error, file=sys.stderr)
        return 1
    print(f"The mutant table matches the code: {len(mutants)} mutants, each snippet found once.")
    return 0


@dataclass(frozen=True)
class Tree:
    """A copy of the repository that one worker mutates and runs pytest in, and the
    PostgreSQL database of its own its selections use (None without DATABASE_URL)."""

    index: int
    root: Path
    database_url: str | None


@dataclass(frozen=True)
class Task:
    """A selection to run in a tree: a mutant's, or (``mutant`` None) one of the baseline
    selections on the unmutated code."""

    tests: tuple[str, ...]
    postgres: bool
    mutant: Mutant | None = None


def tree_files(root: Path) -> list[str]:
    """The files of the checkout to copy: what git tracks or would track (its ignore rules
    leave out virtualenvs and caches), or, outside a git checkout, every file but those."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".venv312", "__pycache__", ".mypy_cache", ".ruff_cache"}
        return [
            path.relative_to(root).as_posix()
            for path in root.rglob("*")
            if path.is_file() and not skip.intersection(path.relative_to(root).parts)
        ]
    return sorted({name for name in listed.decode().split("\0") if name})


def make_tree(index: int, base: Path, files: Sequence[str]) -> Path:
    """Copy ``files`` of the checkout into ``base/tree-<index>`` (times kept), compile its
    Python files once, and return it. Beside the trees, ``base/shared`` points at the
    checkout's ../shared, so a copy finds the tiktoken cache and the data as the checkout
    does."""
    root = base / f"tree-{index}"
    for name in files:
        source = REPO_ROOT / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    shared = REPO_ROOT.parent / "shared"
    if shared.is_dir() and not (base / "shared").exists():
        (base / "shared").symlink_to(shared.resolve())
    # The unmutated bytecode, written once: a run never writes any (PYTHONDONTWRITEBYTECODE),
    # and a mutated file's times differ from the original's, so its cache is never used.
    compileall.compile_dir(root / "ctxsum", quiet=1)
    return root


def worker_database(url: str | None, index: int) -> str | None:
    """The PostgreSQL URL of worker ``index``: the database name with ``_mutants<index>``
    appended, so each worker's pytest makes a test database of its own."""
    if url is None:
        return None
    parts = urlsplit(url)
    name = parts.path.lstrip("/") or "postgres"
    return urlunsplit(parts._replace(path=f"/{name}_mutants{index}"))


def check_imports_from(tree: Tree) -> None:
    """Python run in the tree must import ctxsum and the tests from the tree, not from the
    checkout the virtualenv was installed from (else no mutant would be seen)."""
    code = "import ctxsum, tests.support.shared as s; print(ctxsum.__file__); print(s.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree.root,
        env=pytest_env(False),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    root = tree.root.resolve()
    if not all(Path(path).resolve().is_relative_to(root) for path in found):
        raise SystemExit(f"Python run in {tree.root} imports {found}, not the copy's files")


@contextmanager
def applied(mutant: Mutant, root: Path | None = None) -> Iterator[None]:
    """The mutant written into its file under ``root`` (the checkout by default), which is
    restored (bytes and times) on exit."""
    path = (REPO_ROOT if root is None else root) / mutant.path
    original, stat = path.read_bytes(), path.stat()
    mutated = original.decode().replace(mutant.before, mutant.after, 1).encode()
    try:
        path.write_bytes(mutated)
        # A second later than the original: a bytecode cache of the original (same size
        # by chance, written the same second) never stands in for the mutant.
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        yield
    finally:
        path.write_bytes(original)
        # The original times keep the original bytecode cache valid, and a cache compiled
        # from the mutant (if one were ever written) stale.
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        if path.read_bytes() != original:
            raise RuntimeError(f"{mutant.path} was not restored after {mutant.name}")


def postgres_url() -> str | None:
    """DATABASE_URL when it names a PostgreSQL database."""
    url = os.environ.get("DATABASE_URL", "")
    return url if url.startswith(("postgres://", "postgresql://")) else None


def pytest_env(postgres: bool, database_url: str | None = None) -> dict[str, str]:
    """The subprocess environment: no bytecode written, and SQLite unless ``postgres``
    (then ``database_url``, when given, instead of DATABASE_URL)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("DATABASE_URL", None)
    if postgres and (database_url or postgres_url()):
        env["DATABASE_URL"] = database_url or os.environ["DATABASE_URL"]
    return env


# The pytest processes running now, killed if the run is interrupted.
RUNNING: set[subprocess.Popen[str]] = set()
RUNNING_LOCK = threading.Lock()


def run_pytest(
    tests: Sequence[str], *, postgres: bool, timeout: float, tree: Tree | None = None
) -> tuple[int, str]:
    """Exit status and output of pytest over ``tests`` in ``tree`` (the checkout by
    default); a timeout counts as a failure (1)."""
    command = [sys.executable, "-m", "pytest", *PYTEST_OPTIONS, *tests]
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT if tree is None else tree.root,
        env=pytest_env(postgres, None if tree is None else tree.database_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with RUNNING_LOCK:
        RUNNING.add(process)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return 1, f"TIMEOUT after {timeout:.0f} s"
    finally:
        with RUNNING_LOCK:
            RUNNING.discard(process)
    return process.returncode, output


def first_failure(output: str) -> str:
    """The test pytest reported first as failed or in error, else the last line of output."""
    # "FAILED tests/x.py::test[an id with spaces] - AssertionError: ...", not a log line
    # such as "ERROR    ctxsum.compaction:compaction.py:390 ...".
    summary = re.compile(r"^(?:FAILED|ERROR) (\S+\.py(?:::\S.*?)?)(?: - .*)?$", re.MULTILINE)
    match = summary.search(output)
    if match:
        return match.group(1)
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def last_line(output: str) -> str:
    """pytest's closing line ("3 passed in 2.1s"), without its frame of "=" signs."""
    lines = [line.strip("= ") for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_mutant(mutant: Mutant, *, timeout: float, tree: Tree | None = None) -> Result:
    """Apply ``mutant`` in ``tree`` (the checkout by default), run its selection there,
    restore the file."""
    result = Result(
        mutant.name,
        mutant.path,
        mutant.database,
        "skipped",
        0.0,
        survives=mutant.survives,
        tests=list(mutant.tests),
    )
    if mutant.postgres and postgres_url() is None:
        result.summary = "needs DATABASE_URL naming a PostgreSQL database"
        return result
    started = time.monotonic()
    with applied(mutant, None if tree is None else tree.root):
        status, output = run_pytest(
            mutant.tests, postgres=mutant.postgres, timeout=timeout, tree=tree
        )
    result.seconds = round(time.monotonic() - started, 1)
    result.summary = last_line(output)
    if status not in (0, 1, 2):  # 1: a test failed; 2: the mutant broke collection
        raise RuntimeError(f"{mutant.name}: pytest exited {status}:\n{output[-2000:]}")
    if status:
        result.status = "stale" if mutant.survives else "killed"
        result.killed_by = first_failure(output)
    else:
        result.status = "expected" if mutant.survives else "survived"
    return result


def baseline_tasks(mutants: Sequence[Mutant]) -> list[Task]:
    """Each distinct selection once on the unmutated code, on its database: one that fails
    there would kill every mutant that runs it."""
    selections = {(m.tests, m.postgres) for m in mutants if not m.postgres or postgres_url()}
    return [Task(tests, postgres) for tests, postgres in sorted(selections)]


def mutant_tasks(mutants: Sequence[Mutant]) -> list[Task]:
    """One task a mutant, those on PostgreSQL (the slowest selections) first, so that the
    workers finish together."""
    ordered = sorted(mutants, key=lambda mutant: not mutant.postgres)
    return [Task(mutant.tests, mutant.postgres, mutant) for mutant in ordered]


class Pool:
    """Workers, one a tree, taking tasks in order from one list: the baseline selections,
    then the mutants. A baseline that fails stops every worker."""

    def __init__(self, trees: Sequence[Tree], tasks: Sequence[Task], timeout: float) -> None:
        self.trees, self.timeout = trees, timeout
        self.tasks = list(reversed(tasks))  # popped from the end: in order
        self.lock = threading.Lock()
        self.results: dict[str, Result] = {}
        self.failures: list[str] = []  # baseline failures and errors

    def next_task(self) -> Task | None:
        with self.lock:
            return self.tasks.pop() if self.tasks and not self.failures else None

    def work(self, tree: Tree) -> None:
        try:
            while (task := self.next_task()) is not None:
                self.run(task, tree)
        except BaseException as error:  # reported, and the run fails
            with self.lock:
                self.failures.append(f"worker {tree.index}: {error!r}")

    def run(self, task: Task, tree: Tree) -> None:
        if task.mutant is None:
            status, output = run_pytest(
                task.tests, postgres=task.postgres, timeout=self.timeout, tree=tree
            )
            if status != 0:
                with self.lock:
                    self.failures.append(
                        f"The unmutated code fails {list(task.tests)}:\n{output[-3000:]}"
                    )
            return
        result = run_mutant(task.mutant, timeout=self.timeout, tree=tree)
        with self.lock:
            self.results[result.name] = result
        print(
            f"{result.name}: {result.status} ({result.seconds:.1f} s, worker {tree.index})",
            flush=True,
        )

    def run_all(self) -> None:
        threads = [threading.Thread(target=self.work, args=(tree,)) for tree in self.trees]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:
            with self.lock:
                self.tasks.clear()
            with RUNNING_LOCK:
                for process in RUNNING:
                    process.kill()
            raise


def run_in_trees(
    mutants: Sequence[Mutant], *, jobs: int, timeout: float, baseline: bool
) -> list[Result]:
    """Every mutant run by ``jobs`` workers, each in a copy of the checkout of its own (the
    checkout itself is never changed), after the baseline unless ``baseline`` is false; the
    results in the order of ``mutants``."""
    files = tree_files(REPO_ROOT)
    with tempfile.TemporaryDirectory(prefix="ctxsum-mutants-") as base:
        trees = [
            Tree(index, make_tree(index, Path(base), files), worker_database(postgres_url(), index))
            for index in range(jobs)
        ]
        check_imports_from(trees[0])
        tasks = (baseline_tasks(mutants) if baseline else []) + mutant_tasks(mutants)
        pool = Pool(trees, tasks, timeout)
        pool.run_all()
    if pool.failures:
        raise SystemExit("\n".join(pool.failures))
    return [pool.results[mutant.name] for mutant in mutants]


def print_table(results: Sequence[Result]) -> None:
    """One line a mutant (status, seconds, the test that killed it), then the counts."""
    width = max(len(result.name) for result in results)
    for result in results:
        detail = result.killed_by or result.survives or result.summary
        print(
            f"{result.name:<{width}}  {result.database:<10}  {result.status:<8}  "
            f"{result.seconds:>6.1f}s  {detail}"
        )
    print(", ".join(f"{count} {status}" for status, count in counts(results).items()))


def counts(results: Sequence[Result]) -> dict[str, int]:
    return {status: sum(result.status == status for result in results) for status in STATUSES}


def selected(names: Sequence[str] | None) -> list[Mutant]:
    """The mutants named by ``--only``, in that order; all of them when none is named."""
    if not names:
        return list(MUTANTS)
    known = {mutant.name: mutant for mutant in MUTANTS}
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"Unknown mutants: {', '.join(unknown)}")
    return [known[name] for name in names]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.mutants",
        description="Apply each hand-made mutant in turn and run the tests that should kill it.",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--check",
        action="store_true",
        help="check that every snippet occurs once in its file, run nothing, and exit",
    )
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run this mutant only (repeatable)"
    )
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds one selection may run (default %(default)s)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="run N mutants at a time, each worker in a copy of the checkout of its own "
        "(default: the number of CPUs)",
    )
    parser.add_argument(
        "--skip-baseline",
        action="store_true",
        help="do not run the selections on the unmutated code first",
    )
    return parser.parse_args(argv)


def write_output(path: Path, results: Sequence[Result], seconds: float) -> None:
    """The results as JSON: total seconds, counts by status, and one object a mutant."""
    report = {
        "seconds": round(seconds, 1),
        "counts": counts(results),
        "mutants": [asdict(result) for result in results],
    }
    path.write_text(json.dumps(report, indent=2) + "\n")


def interrupted(signum: int, frame: object) -> None:
    # A terminated run must still restore the mutated file: unwind through the finally.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0 when every mutant was killed or survived as expected, 1 otherwise."""
    args = parse_args(argv)
    status = check(MUTANTS)  # a table that drifted from the code runs nothing
    if args.check or status:
        return status
    mutants = selected(args.only)
    if args.list:
        for mutant in mutants:
            tests = " ".join(mutant.tests)
            print(f"{mutant.name:<36} {mutant.path:<32} {mutant.database:<10} {tests}")
        return 0
    use_tiktoken_cache()
    signal.signal(signal.SIGTERM, interrupted)
    started = time.monotonic()
    results = run_in_trees(
        mutants, jobs=max(1, args.jobs), timeout=args.timeout, baseline=not args.skip_baseline
    )
    seconds = time.monotonic() - started
    print_table(results)
    print(f"{len(results)} mutants in {seconds:.0f} s")
    if args.output:
        write_output(args.output, results, seconds)
    return 1 if any(result.status in ("survived", "stale") for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
