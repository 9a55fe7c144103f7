"""Readers of engine logs: vLLM (stats, Iteration, spec-decode, KV-transfer, CUDA-graph lines) and SGLang
(Prefill/Decode batch lines), and what they share (prefixes, clocks, rows -> Timeline).

May import: mixdiag.schema, mixdiag.errors, mixdiag.wire, mixdiag.collectors (provenance, text_input)."""
