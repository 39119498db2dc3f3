"""The test profiles, chosen by ``CTXSUM_TEST_PROFILE``: how large the property suites run.

- ``dev`` (the default): every test runs, the property suites at a quarter of their examples,
  so that ``make test`` stays quick on a small machine;
- ``ci``: every property suite at its full size, as ``.ci/run`` runs them.

A suite states its full size through ``examples(full)``; Hypothesis tests that pin no size
get the profile's ``max_examples``. The profile in use is printed in pytest's header.
"""

from __future__ import annotations

import os

from hypothesis import settings

VARIABLE = "CTXSUM_TEST_PROFILE"
DEFAULT = "dev"
# The share of its full size a property suite runs in each profile.
SHARES = {"dev": 0.25, "ci": 1.0}
# Hypothesis' own default size (100 examples) is the full one.
FULL_MAX_EXAMPLES = 100


def profile() -> str:
    """The profile ``CTXSUM_TEST_PROFILE`` names; an unknown name is an error, not a guess."""
    name = os.environ.get(VARIABLE, "") or DEFAULT
    if name not in SHARES:
        known = ", ".join(SHARES)
        raise ValueError(f"{VARIABLE}={name!r} is not a test profile (known: {known})")
    return name


def examples(full: int) -> int:
    """``full`` in the ci profile; the profile's share of it (at least one) in the others."""
    return _scaled(profile(), full)


def load() -> str:
    """Register both profiles with Hypothesis and load the one in use; answers its name."""
    for name in SHARES:
        # print_blob: a failure in CI prints what reproduces it locally.
        settings.register_profile(
            name, max_examples=_scaled(name, FULL_MAX_EXAMPLES), print_blob=name == "ci"
        )
    name = profile()
    settings.load_profile(name)
    return name


def _scaled(name: str, full: int) -> int:
    return max(1, round(full * SHARES[name]))
