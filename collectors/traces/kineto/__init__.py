"""PyTorch-profiler (Kineto / Chrome trace) JSON: ``reader`` (format ``kineto-json``), ``events``
(streaming decode into an event frame), ``activity`` (events as a foreign-engine ``Activity``).

May import: mixdiag.schema, mixdiag.errors, mixdiag.wire, mixdiag.collectors.provenance,
mixdiag.collectors.traces.steps."""
