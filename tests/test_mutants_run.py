"""The mutation run's own machinery (``python -m tests.support.mutants``, a step of
.ci/run): each worker patches a copy of the checkout of its own, on a PostgreSQL test
database of its own, and a patched file is put back as it was. The run itself (every
mutant against the real tests) is that CI step's business, not the unit suite's."""

from __future__ import annotations

import os

from tests.support import mutants
from tests.support.mutants import Mutant, applied, tree_files, worker_database

MUTANT = Mutant(
    "pinned-max", "pkg/policy.py", "PINNED_MAX = 3", "PINNED_MAX = 2", ("tests/test_policy.py",)
)


def test_each_worker_has_a_database_of_its_own() -> None:
    url = "postgres://root@127.0.0.1:5432/ci?sslmode=disable"
    assert worker_database(url, 0) == "postgres://root@127.0.0.1:5432/ci_mutants0?sslmode=disable"
    assert worker_database(url, 1) == "postgres://root@127.0.0.1:5432/ci_mutants1?sslmode=disable"
    assert worker_database(None, 0) is None


def test_a_mutant_is_written_into_the_tree_given_and_put_back_with_its_times(tmp_path) -> None:
    path = tmp_path / "pkg/policy.py"
    path.parent.mkdir()
    path.write_text("PINNED_MAX = 3\n")
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = path.stat()
    with applied(MUTANT, tmp_path):
        assert path.read_text() == "PINNED_MAX = 2\n"
        # Never the original's second: a bytecode cache of the original is not used for it.
        assert int(path.stat().st_mtime) != int(before.st_mtime)
    assert path.read_text() == "PINNED_MAX = 3\n"
    assert path.stat().st_mtime_ns == before.st_mtime_ns


def test_the_copy_holds_the_sources_and_not_the_virtualenv() -> None:
    files = tree_files(mutants.REPO_ROOT)
    assert "tests/support/mutants.py" in files
    assert "ctxsum/policy.py" in files
    assert not [name for name in files if name.startswith((".venv/", ".git/"))]
