"""The inference loop: step loop, schedulers, requests, KV cache and prefix cache, the flat input batch,
sampling, per-step records and the engine's configuration.

May import: torch, numpy, mixdiag.schema, mixdiag.engine.model (the forward pass). Never the testbed,
telemetry, collectors, diagnosis or dashboard."""
