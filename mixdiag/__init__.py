"""mixdiag: tell why time-per-output-token spiked.

The package core holds the data contract (:mod:`mixdiag.schema`), the diagnosis and the CLI.
The reference engine, the collectors and the dashboard install as ``mixdiag.engine``,
``mixdiag.collectors`` and ``mixdiag.dashboard``.
"""
__version__ = "0.1.0"



def __getattr__(name):
    # Timeline/SchemaError load pandas: resolved on first use, so `mixdiag --help` stays light.
    if name in ("SchemaError", "Timeline"):
        from mixdiag import schema

        return getattr(schema, name)
    raise AttributeError(f"module 'mixdiag' has no attribute {name!r}")
