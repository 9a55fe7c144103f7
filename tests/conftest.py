"""Shared pytest setup: make ``tests/helpers`` importable and expose its fixtures everywhere."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers.prometheus_server import metrics_endpoint, prometheus_server  # noqa: E402,F401  (fixtures)
