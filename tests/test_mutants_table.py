"""The mutant table of tests/support/mutants.py still matches the code: a refactoring that
moves a snippet must move its mutant too, or the whole run refuses to start."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.mutants import MUTANTS, TableError, check_table


def test_every_snippet_occurs_once_in_its_file() -> None:
    check_table(MUTANTS)


def test_a_snippet_the_code_lost_is_reported_by_name() -> None:
    lost = dataclasses.replace(MUTANTS[0], before="a line no source file holds")
    with pytest.raises(TableError, match=f"{MUTANTS[0].name}: the snippet occurs 0 times"):
        check_table([lost, *MUTANTS[1:]])
