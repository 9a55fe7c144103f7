"""The fault testbed: scenarios and workloads, the run orchestration behind `mixdiag run`, faults that
really happen (expert-parallel hotspots, PD transfers, graph misses, host stalls, KV pressure), their ground
truth and multi-instance runs.

May import: the engine's core, model and telemetry rooms, mixdiag.schema, mixdiag.errors, mixdiag.causes.
Never the collectors' readers, the diagnosis or the dashboard."""
