"""The test profiles, chosen by ``CTXSUM_TEST_PROFILE`` (docs/testing.md, "Profiles").

- ``dev`` (the default): ``make test`` leaves the tests marked ``slow`` out, and a property
  suite run by hand runs a quarter of its examples;
- ``ci``: every test, each property suite at its full size, as ``.ci/run`` runs them; a
  Hypothesis failure prints the blob that reproduces it.

A property suite states its full size as ``max_examples=examples(full)``; Hypothesis tests
that pin their own size keep it in both. The profile in use is printed in pytest's header.
"""

from __future__ import annotations

import os

from hypothesis import settings

VARIABLE = "CTXSUM_TEST_PROFILE"
DEFAULT = "dev"
# The share of its full size a property suite runs in each profile.
SHARES = {"dev": 0.25, "ci": 1.0}


def profile() -> str:
    """The profile ``CTXSUM_TEST_PROFILE`` names; an unknown name is an error, not a guess."""
    name = os.environ.get(VARIABLE, "") or DEFAULT
    if name not in SHARES:
        known = ", ".join(SHARES)
        raise ValueError(f"{VARIABLE}={name!r} is not a test profile (known: {known})")
    return name


def examples(full: int) -> int:
    """``full`` in the ci profile; the profile's share of it (at least one) in the others."""
    return max(1, round(full * SHARES[profile()]))


def load() -> str:
    """Register both profiles with Hypothesis and load the one in use; answers its name."""
    for name in SHARES:
        settings.register_profile(name, print_blob=name == "ci")
    name = profile()
    settings.load_profile(name)
    return name
