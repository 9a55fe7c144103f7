"""The inference loop: step loop, schedulers, requests, KV cache and prefix cache, the flat input batch,
sampling and per-step records.

May import: torch, numpy, the base layer (mixdiag.schema, mixdiag.wire, mixdiag.errors),
mixdiag.engine.config, mixdiag.engine.hooks and mixdiag.engine.model (the forward pass). Never the
testbed or telemetry (core sees telemetry only through the ``Tracer`` seam in engine/hooks.py),
collectors, diagnosis or dashboard."""
