"""``mixdiag tune``: from the user's own data to a scheduler setting (chunk size, token budget, ...).

What lives here, one concept per module:

* :mod:`.traffic` — the requests (arrival, prompt and output length) estimated from a Timeline,
  with the estimate's quality (measured token events / records, or counters and histograms).
* :mod:`.cost_model` — step duration as a function of prefill tokens, decode rows and KV context,
  fitted to the Timeline's per-step rows (R², held-out MAPE), or the shape ledger + device model
  when the input has no per-step durations.
* :mod:`.replay` — a discrete-event replay on a modelled clock that drives the engine's *own*
  scheduler classes (``mixdiag.engine.core.schedulers``) with real ``Request`` objects and a real
  KV block pool; no copy of any policy lives here.
* :mod:`.frontier` — the knob sweep, its Pareto frontier (P99 ITL vs P99 TTFT, with throughput),
  the recommendation under SLOs and the predicted change from the current setting.
* :mod:`.sweep` — one tuning run (Timeline -> workload, cost model, sweep, recommendation);
  :mod:`.frontier_report` — the frontier figure and the HTML report.

Imports: numpy/pandas, :mod:`mixdiag.schema`, :mod:`mixdiag.errors`, :mod:`mixdiag.ledger`, and for
:mod:`.frontier_report` :mod:`mixdiag.fmt` and :mod:`mixdiag.html_page` (plotly lazily); the
engine (:mod:`mixdiag.engine.core`, which pulls in torch) only lazily inside :mod:`.replay`'s
functions, so ``mixdiag --help`` and this package's import stay torch-free. Nothing here imports
collectors, diagnosis, the analyze reports or the dashboard.
"""
