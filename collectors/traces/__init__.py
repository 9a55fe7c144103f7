"""Trace readers: Nsight Systems SQLite exports, PyTorch-profiler (Kineto) JSON, and the step
reconstruction they share.

May import: mixdiag.schema, mixdiag.errors, mixdiag.wire, mixdiag.collectors (provenance). Never torch."""
