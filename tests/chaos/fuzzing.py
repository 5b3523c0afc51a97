"""Hypothesis settings for the fuzz tests: modest by default, a profile for a longer run.

``CHAOS_FUZZ_PROFILE=chaos-fuzz-long`` (2,000 examples per test) for a long run; the default profile runs
``CHAOS_FUZZ_EXAMPLES`` (default 40) examples per test. Profiles are applied per test with ``@FUZZ``, never
loaded globally, so other suites' Hypothesis settings are untouched.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["FUZZ"]

settings.register_profile(
    "chaos-fuzz",
    max_examples=int(os.environ.get("CHAOS_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "chaos-fuzz-long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
FUZZ = settings(settings.get_profile(os.environ.get("CHAOS_FUZZ_PROFILE", "chaos-fuzz")))
"""Decorator: the fuzz tests' settings."""
