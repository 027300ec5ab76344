"""Suite-wide pytest hooks: the random fuzz sample's seed, drawn once and printed."""

from __future__ import annotations

from tests.util import FUZZ_SEED_ENV, fuzz_seed


def pytest_configure(config) -> None:
    """Draw the fuzz seed in the controller, before xdist workers inherit the environment."""
    fuzz_seed()


def pytest_report_header(config) -> str:
    """Print the seed, so a failing random fuzz sample can be replayed."""
    return f"fuzz sample seed: {fuzz_seed()} (replay: {FUZZ_SEED_ENV}={fuzz_seed()})"
