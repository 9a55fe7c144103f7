"""mixdiag: tell why time-per-output-token spiked.

The package core holds the data contract (:mod:`mixdiag.schema`), the diagnosis and the CLI.
The reference engine, the collectors and the dashboard install as ``mixdiag.engine``,
``mixdiag.collectors`` and ``mixdiag.dashboard``.
"""
__version__ = "0.1.0"

from mixdiag.schema import SchemaError, Timeline  # noqa: E402,F401
