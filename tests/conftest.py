"""Shared pytest setup: make ``tests/helpers`` importable and expose its fixtures everywhere."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers.prometheus_server import metrics_endpoint, prometheus_server  # noqa: E402,F401  (fixtures)
from helpers.diff_runs import small_chunk_runs  # noqa: E402,F401  (fixture: two tiny runs for `mixdiag diff`)

# Property tests explore a fixed sequence of examples (derandomize) so a CI run is reproducible;
# `HYPOTHESIS_PROFILE=explore` draws fresh random examples for a longer local bug hunt.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, max_examples=500)
settings.load_profile(__import__("os").environ.get("HYPOTHESIS_PROFILE", "ci"))
