"""The check of the mutant table (``python -m tests.support.mutants --check``, a step of
.ci/run) names every mutant whose snippet no longer matches its file. Whether the real
table matches the code today is that step's business, not the unit suite's: these tests
check tables of their own against files of their own."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support import mutants
from tests.support.mutants import Mutant, TableError, check_table

MUTANT = Mutant(
    "pinned-max", "pkg/policy.py", "PINNED_MAX = 3", "PINNED_MAX = 2", ("tests/test_policy.py",)
)


@pytest.fixture(autouse=True)
def repo(tmp_path, monkeypatch):
    """A repository of two files, where the table's paths are read."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/policy.py").write_text("PINNED_MAX = 3\n\nKEEP = 1\n\nTRIGGER = 2\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_policy.py").write_text("")
    monkeypatch.setattr(mutants, "REPO_ROOT", tmp_path)
    return tmp_path


def test_a_matching_table_passes() -> None:
    check_table([MUTANT])


def test_a_snippet_the_code_lost_is_reported_by_name() -> None:
    lost = dataclasses.replace(MUTANT, name="lost", before="a line no source file holds")
    with pytest.raises(TableError, match=r"lost: the snippet occurs 0 times in pkg/policy\.py"):
        check_table([MUTANT, lost])


def test_a_snippet_found_twice_or_a_test_file_gone_is_reported_by_name() -> None:
    twice = dataclasses.replace(MUTANT, name="twice", before="\n\n")
    gone = dataclasses.replace(MUTANT, name="gone", tests=("tests/test_gone.py::test_x",))
    with pytest.raises(TableError) as raised:
        check_table([MUTANT, twice, gone])
    problems = str(raised.value).splitlines()
    assert problems == [
        "twice: the snippet occurs 2 times in pkg/policy.py",
        "gone: its selection names tests/test_gone.py::test_x, which is gone",
    ]


def test_the_check_step_fails_naming_the_mutant(monkeypatch, capsys) -> None:
    lost = dataclasses.replace(MUTANT, name="lost", before="PINNED_MAX = 4")
    monkeypatch.setattr(mutants, "MUTANTS", (MUTANT, lost))
    assert mutants.main(["--check"]) == 1
    error = capsys.readouterr().err
    assert "no longer matches the code" in error
    assert "lost: the snippet occurs 0 times in pkg/policy.py" in error


def test_the_check_step_passes_a_matching_table(monkeypatch, capsys) -> None:
    monkeypatch.setattr(mutants, "MUTANTS", (MUTANT,))
    assert mutants.main(["--check"]) == 0
    assert "matches the code: 1 mutants," in capsys.readouterr().out
