"""One tuning run: Timeline -> workload + step-cost model -> current setting -> sweep -> frontier + recommendation.

The current setting is what the input says (``meta['scheduler']``/``meta['cache']`` of an engine
run), overridden by ``current`` knob values; otherwise token_budget with a budget equal to the
largest step seen and a KV pool too large to preempt (both stated in the notes).
"""
from __future__ import annotations

import dataclasses
import time

from mixdiag.errors import UserError
from mixdiag.tuning import cost_model, frontend, frontier, traffic

#: foreign inputs: a KV pool no realistic workload fills (the replay then never preempts)
LARGE_POOL_BLOCKS = 1 << 18


def base_config(tl, rows, current: dict, notes: list[str]):
    """(SchedulerConfig, CacheConfig, max_model_len) of the current setting."""
    from mixdiag.engine.config import CacheConfig, SchedulerConfig

    meta = tl.meta or {}
    sched, cache, mml = meta.get("scheduler"), meta.get("cache"), int(meta.get("max_model_len") or 0)
    if isinstance(sched, dict):
        fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
        base = SchedulerConfig(**{k: v for k, v in sched.items() if k in fields})
    else:
        budget = int(max((rows["prefill_tokens"] + rows["decode_rows"]).max(), 1)) if len(rows) else 2048
        base = SchedulerConfig(policy=str(meta.get("policy") or "token_budget"), max_num_batched_tokens=budget,
                               chunked_prefill_size=budget)
        if not {"chunk_size", "max_batched_tokens"} & set(current):
            notes.append(f"current setting not recorded: assumed policy {base.policy}, chunk_size {budget} "
                         "(the largest step seen); pass --current NAME=V to correct it")
    cc = CacheConfig(**cache) if isinstance(cache, dict) else CacheConfig(num_blocks=LARGE_POOL_BLOCKS)
    if not isinstance(cache, dict):
        notes.append("KV pool size not recorded: replayed with a pool too large to preempt")
    return frontier.apply(base, current), cc, mml or 1 << 20


def fit_cost(tl, wl, rows, base, cache, mml, notes: list[str], ledger_model: str, ledger_device: str):
    """The step-cost model: fitted to per-step rows (exact context when the replay aligns), else the ledger."""
    if len(rows) >= 8:
        reqs = [r for r in wl.requests if r.arrival_s <= float(rows["t_end_s"].max())]
        from mixdiag.tuning.replay import align

        causal = _step_format(tl, rows) in cost_model.CAUSAL_KERNEL_SOURCES
        if causal:
            notes.append("steps from vLLM's own records: its attention kernels skip the masked blocks, so a chunk's "
                         "own attention is fitted as causal unless the dense form fits clearly better")
        shapes, share = align(reqs, rows, base, cache, mml)
        if shapes is not None:
            return cost_model.fit(rows, shapes, "exact (the replay reproduces the recorded steps)", causal_kernel=causal)
        notes.append(f"the replay of the current setting matches {100 * share:.0f} % of the recorded steps: "
                     "context features estimated from step rows")
        return cost_model.fit(rows, cost_model.estimated_shapes(rows, cache.num_blocks * cache.block_size),
                              "estimated from step rows", causal_kernel=causal)
    from mixdiag.ledger.device_model import device
    from mixdiag.ledger.shapes import resolve

    notes.append(f"no per-step durations in the input: step costs from the shape ledger ({ledger_model}) on the "
                 f"{ledger_device} device model, not fitted to your data")
    return cost_model.LedgerCost(resolve(ledger_model, None), device(ledger_device))


def run(tl, knobs: list[tuple[str, list]], *, slo_itl: float | None = None, slo_ttft: float | None = None,
        current: dict | None = None, window_s: float | None = None, jobs: int = 0,
        ledger_model: str = "glm-5.3", ledger_device: str = "h200", traffic_tl=None) -> dict:
    """The whole tuning result as plain data (what ``mixdiag tune --json`` prints). ``traffic_tl``:
    where the requests come from when ``tl`` (the steps) holds no token events, e.g. client records
    read beside an engine's iteration log (:func:`traffic_source`)."""
    t0 = time.perf_counter()
    for v in (slo_itl, slo_ttft):
        if v is not None and not v > 0:
            raise UserError("SLOs must be positive seconds")
    if not knobs:
        raise UserError("give at least one --knob NAME=V1,V2,... to sweep (e.g. --knob chunk_size=256,512,1024)")
    wl = traffic.from_timeline(tl if traffic_tl is None else traffic_tl)
    if window_s is not None:
        wl = wl.window(window_s)
    notes = list(wl.notes)
    step_inst = wl.instance if traffic_tl is None else _step_instance(tl)
    if traffic_tl is not None:
        notes.append(f"requests from the token events of {wl.instance}, step costs from the steps of {step_inst}")
    steps = tl.steps[tl.steps["instance"] == step_inst] if tl.steps is not None and len(tl.steps) else None
    rows = cost_model.step_rows(steps)
    base, cache, mml = base_config(tl, rows, current or {}, notes)
    cost = fit_cost(tl, wl, rows, base, cache, mml, notes, ledger_model, ledger_device)
    settings = frontier.grid(knobs)
    cur_setting = {name: _current_value(base, name) for name, _ in knobs}
    if cur_setting not in settings:
        settings = [cur_setting] + settings
    admission = traffic.stamped_between_steps(wl, rows)
    if admission:
        notes.append("arrival stamps all fall between steps (admissions): TTFT is replayed from admission, "
                     "as the data measured it")
    fe = client_delay(traffic_tl, wl, rows)
    if fe is not None:
        d = fe.describe()
        notes.append(f"client token times joined to the engine's steps ({d['tokens']} tokens of {d['requests']} requests): "
                     f"front-end delay P50 {1e3 * d['lag_p50_s']:.1f} ms, P99 {1e3 * d['lag_p99_s']:.1f} ms, "
                     "added to the replayed tokens as measured over time")
        if d["stalls"]:
            notes.append(f"the front end stalled {d['stalls']} times in the input ({d['stalled_s']:.1f} s in all: tokens "
                         f"held over {frontend.STALL_STEPS}+ engine steps); stalls are the host's, not the setting's, "
                         "and are not carried into the predictions: a run that stalls as this one did has a higher P99 ITL")
    results = frontier.sweep(wl.requests, cost, base, cache, mml, settings, jobs, ttft_from_admission=admission,
                             frontend=fe)
    # how far each setting's steps reach beyond the steps the cost was fitted on (frontier.extrapolated)
    fitted_max = float((rows["prefill_tokens"] + rows["decode_rows"]).max()) \
        if isinstance(cost, cost_model.FittedCost) and len(rows) else None
    for r in results:
        r["extrapolation_x"] = (r["max_step_tokens"] / fitted_max) if fitted_max else None
    cur = next(r for r in results if r["setting"] == cur_setting)
    for r in results:
        r["current"] = r is cur
    front = frontier.pareto(results)
    on_front = {id(r) for r in front}
    for r in results:
        r["pareto"] = id(r) in on_front
    rec, why = frontier.recommend(results, slo_itl, slo_ttft)
    measured = measured_p99(tl if traffic_tl is None else traffic_tl, wl)
    return {"workload": wl.summary(), "cost_model": cost.describe(), "current": cur, "measured_current": measured,
            "frontend_delay": None if fe is None else fe.describe(),
            "settings": results, "frontier": [r["label"] for r in front],
            "slo": {"itl_p99_s": slo_itl, "ttft_p99_s": slo_ttft},
            "recommendation": None if rec is None else rec["label"], "recommended": rec, "reason": why,
            "predicted_change": frontier.change(cur, rec), "notes": notes, "seconds": time.perf_counter() - t0}


def client_delay(traffic_tl, wl, rows):
    """The client's front-end delay over the engine's steps (:mod:`mixdiag.tuning.frontend`) when the
    requests come from client records beside an engine's own step records (``traffic_tl``); None
    otherwise - an engine's own token events are stamped by the engine, with no front end between."""
    if traffic_tl is None or traffic_tl.tokens is None or not len(rows) or not wl.requests:
        return None
    tok = traffic_tl.tokens[traffic_tl.tokens["instance"] == wl.instance]
    return frontend.measure(tok, rows["t_end_s"].to_numpy(), wl.requests[0].arrival_s)


def sources(tl, load_one, paths: list[str]):
    """(the Timeline whose steps the costs are fitted on, the Timeline to take requests from or None).

    Usually the joined ``tl`` and :func:`traffic_source`. But the join's step spine is the input
    with the finest clock, and a client's token times can out-resolve an engine log's microsecond
    stamps, so the joined steps may be the ones rebuilt from client reads (``step_source`` client)
    with the engine's own records merged into them by time - durations that are token gaps, not
    steps (real vLLM 0.32 testbed, two runs of one traffic: the log was the spine in one, the
    client in the other, where the fit fell to R² 0.21). Then the steps come from the input that
    has the engine's own step records, read on its own, and the requests from the joined Timeline."""
    inst = _step_instance(tl)
    st = tl.steps[tl.steps["instance"] == inst] if inst is not None else None
    if len(paths) >= 2 and st is not None and len(st) and "step_source" in st \
            and bool((st["step_source"] == "client").all()):
        for path in paths:
            one = load_one(path)
            if one.steps is None or not len(one.steps) or "step_source" not in one.steps:
                continue
            own = one.steps[one.steps["step_source"] != "client"]
            if len(cost_model.step_rows(own)) >= 8:
                return one, tl
    return tl, traffic_source(tl, load_one, paths)


def traffic_source(tl, load_one, paths: list[str]):
    """The Timeline to take requests from when the joined ``tl`` lost its token events: the join
    keeps tokens only on the step view whose clock they set, and an engine's iteration log (exact
    step durations) outranks a client's inferred steps, so the client's records are read on their
    own (``load_one(path)``). None when ``tl`` has token events or no single input has any."""
    if len(paths) < 2 or (tl.tokens is not None and len(tl.tokens)):
        return None
    for p in paths:
        one = load_one(p)
        if one.tokens is not None and len(one.tokens):
            return one
    return None


def _step_format(tl, rows) -> str | None:
    """The input format the fitted step rows were read from (the collectors' ``instance_sources``):
    the one source of their instance that is not a client's, else the Timeline's own source."""
    if not len(rows):
        return None
    inst = str(rows["instance"].iloc[0])
    srcs = (((tl.meta or {}).get("instance_sources") or {}).get(inst) or {}).get("sources") or []
    fmts = {s.get("format") for s in srcs if s.get("role") != "client"}
    if len(fmts) == 1:
        return fmts.pop()
    return (tl.meta or {}).get("source") if not srcs else None


def _step_instance(tl) -> str | None:
    """The instance with the most per-step rows (the engine whose step costs are fitted)."""
    if tl.steps is None or not len(tl.steps):
        return None
    st = tl.steps[tl.steps["granularity"] == "step"]
    counts = (st if len(st) else tl.steps)["instance"].value_counts()
    return str(max(sorted(counts.index), key=lambda k: counts[k]))


def _current_value(base, knob: str):
    return getattr(base, frontier.KNOBS[knob][0][0])


def measured_p99(tl, wl) -> dict:
    """The input's own P99 ITL / TTFT (to set against the replay of the current setting)."""
    import numpy as np

    out = {"itl_p99_s": None, "ttft_p99_s": None}
    if tl.tokens is None or not len(tl.tokens):
        return out
    tok = tl.tokens[tl.tokens["instance"] == wl.instance]
    itl = tl.itl()
    itl = itl[itl["instance"] == wl.instance]["itl_s"].to_numpy()
    if len(itl):
        out["itl_p99_s"] = float(np.quantile(itl, 0.99))
    first = tok.sort_values("t_s").groupby("request_id").head(1).set_index("request_id")["t_s"]
    arr = {r.request_id: r.arrival_s for r in wl.requests}
    ttft = [first[k] - arr[k] for k in first.index if k in arr]
    if ttft and wl.quality.get("arrivals") == "measured":
        out["ttft_p99_s"] = float(np.quantile(ttft, 0.99))
    return out
