"""Nsight Systems SQLite exports: ``reader`` (format ``nsys-sqlite``), ``db`` (safe read-only
probing of the export's tables), ``nvtx`` (step and phase ranges), ``kernels`` (GPU work per step),
``activity`` (the export as a foreign-engine ``Activity``).

May import: mixdiag.schema, mixdiag.errors, mixdiag.wire, mixdiag.collectors.provenance,
mixdiag.collectors.traces.steps. adbc and tqdm lazily."""
