"""A testbed on a real vLLM (0.32, CPU): ``vllm serve`` of a small offline Llama, traffic through
``mixdiag load``, timed ``/metrics`` scrapes, the operator log, injected faults, and truth from the
engine's own per-iteration records (docs/testbed-vllm.md).

Room: like ``engine/testbed`` it produces data and truth; it runs mixdiag only through its CLI
(``mixdiag load``) and imports nothing of the collectors or the diagnosis. One module per concept:
:mod:`.config` (what a run is), :mod:`.fault_plan` (the schedule drawn from the seed),
:mod:`.environment` (.venv-vllm and the model), :mod:`.model_build` (the offline model),
:mod:`.log_routing` (operator log vs truth), :mod:`.server`, :mod:`.scraper`, :mod:`.traffic`,
:mod:`.injectors`, :mod:`.truth`, :mod:`.process_guard` (cleanup), :mod:`.driver` (a run).
"""
