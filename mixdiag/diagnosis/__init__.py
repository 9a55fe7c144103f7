"""The diagnosis: spike detection, per-step signals, fusion of step and interval views of one engine into
evidence, attribution (the one place evidence becomes a cause and a confidence), `diagnose` and its result.

May import: mixdiag.schema, mixdiag.causes, mixdiag.errors, numpy, pandas. Never collectors, engine,
dashboard or torch: it reads Timeline columns and signal qualities, never a source's names."""

from mixdiag.diagnosis.pipeline import Diagnosis, diagnose  # noqa: E402  (the public entry point)

__all__ = ["Diagnosis", "diagnose"]
