"""What watches the engine: instrumentation wiring, Prometheus metrics and their server, timed scrapes,
vLLM/SGLang-style log lines, NVTX / record_function ranges, the Kineto profiler, SM activity.

May import: the engine's core and model rooms, mixdiag.wire (formats shared with the collectors),
mixdiag.gpu_probe (the NVML probe function only). Never the diagnosis or dashboard."""
