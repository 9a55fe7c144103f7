"""What watches the engine: instrumentation wiring, Prometheus metrics (mixdiag's own and the vLLM /
SGLang dialects) and their server, timed scrapes, vLLM/SGLang-style log lines, NVTX /
record_function ranges, the Kineto profiler, SM activity.

May import: the engine's core and model rooms, mixdiag.engine.config / hooks, the base layer
(mixdiag.wire for formats shared with the collectors, mixdiag.errors, mixdiag.gpu_probe for NVML).
Never the testbed, serving, collectors, diagnosis, dashboard or commands (the CLI flags live in
mixdiag/commands/flags.py and arrive here as an InstrumentationConfig)."""
