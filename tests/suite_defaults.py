"""The two ctxsum defaults the test suite changes (docs/testing.md): its conversations are
small by design (a few short messages over a small trigger), their compactions there to show
the mechanics, so they compact whenever due (no compaction of a few short messages pays back
its summarizer call) and keep all of KEEP. Tests marked ``ctxsum_defaults`` run with
ctxsum's own (tests/conftest.py)."""

SUITE_DEFAULTS = {"REQUIRE_PAYOFF": False, "LANDING": "keep"}
