"""Trace readers, one room per source: ``nsys/`` (Nsight Systems SQLite exports), ``kineto/``
(PyTorch-profiler JSON), and ``steps/``, the step reconstruction both share (mixdiag's own step
ranges, foreign engines' steps, their token inference and evidence).

May import: mixdiag.schema, mixdiag.errors, mixdiag.wire, mixdiag.collectors (provenance); ``nsys/``
and ``kineto/`` import ``steps/``, never each other; ``steps/`` imports no reader. Never torch."""
