"""Client-side records as a Timeline source: what a benchmark client saw of each request's stream.

What lives here: ``client_tokens.py`` (per-request token arrival times -> the ``tokens`` frame,
quality ``measured`` at the client), and one reader per format: ``load_records.py`` (``mixdiag
load`` JSON lines), ``vllm_bench.py`` (``vllm bench serve --save-result --save-detailed`` result
JSON), ``guidellm_report.py`` (guidellm's benchmarks report JSON), and ``client_steps.py``: a stall
shared by every in-flight stream at one moment is an engine step, so measured, aligned streams
also give step rows (``step_source = "client"``) that the diagnosis fuses with the server's
scrapes or log on the wall clock like any step view (docs/serving.md).

May import: mixdiag.schema, mixdiag.errors, mixdiag.collectors.provenance.
"""
