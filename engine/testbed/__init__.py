"""The fault testbed: scenarios and workloads, the run orchestration behind `mixdiag run`, faults that
really happen (expert-parallel hotspots, PD transfers and their connector, graph misses, host stalls,
KV pressure), their ground truth and multi-instance runs.

May import: the engine's core, model and telemetry rooms, mixdiag.engine.config, the base layer
(mixdiag.schema, mixdiag.errors, mixdiag.causes). Never serving, the collectors, the diagnosis, the
dashboard or the commands."""
