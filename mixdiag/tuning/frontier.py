"""The knob sweep: replay every setting, keep the Pareto frontier, recommend one under the SLOs.

Knobs (``--knob NAME=V1,V2``) map onto :class:`~mixdiag.engine.config.SchedulerConfig`:
``chunk_size`` (the per-step token budget: vLLM's max_num_batched_tokens and SGLang's
chunked_prefill_size), ``max_batched_tokens``, ``long_prefill_threshold``, ``max_running``
(max_num_seqs), ``mixed_chunk`` (SGLang's enable_mixed_chunk) and ``policy``. Several knobs sweep
their cartesian product.

Recommendation: among the settings meeting every SLO given, the lowest P99 ITL when only a TTFT
SLO is set, the lowest P99 TTFT when only an ITL SLO is set, the highest throughput when both are;
with no SLO, the frontier point nearest both minima (each P99 divided by its best).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from mixdiag.errors import UserError

#: knob -> SchedulerConfig fields it sets, and the value type
KNOBS: dict[str, tuple[tuple[str, ...], type]] = {
    "chunk_size": (("max_num_batched_tokens", "chunked_prefill_size"), int),
    "max_batched_tokens": (("max_num_batched_tokens",), int),
    "long_prefill_threshold": (("long_prefill_token_threshold",), int),
    "max_running": (("max_num_seqs",), int),
    "mixed_chunk": (("enable_mixed_chunk",), bool),
    "policy": (("policy",), str),
}


def parse_knob(text: str) -> tuple[str, list]:
    """``NAME=V1,V2,...`` -> (name, typed values); one-line UserError on anything else."""
    name, sep, vals = text.partition("=")
    name = name.strip()
    if not sep or name not in KNOBS or not vals.strip():
        raise UserError(f"--knob {text!r}: expected NAME=V1,V2,... with NAME one of {', '.join(KNOBS)}")
    typ = KNOBS[name][1]
    out = []
    for v in vals.split(","):
        v = v.strip()
        try:
            if typ is bool:
                if v.lower() not in ("true", "false", "1", "0", "on", "off"):
                    raise ValueError(v)
                out.append(v.lower() in ("true", "1", "on"))
            else:
                out.append(typ(v))
        except ValueError:
            raise UserError(f"--knob {name}: {v!r} is not a {typ.__name__}") from None
    return name, list(dict.fromkeys(out))


def apply(base, setting: dict):
    """``base`` (a SchedulerConfig) with the knob values of ``setting``; UserError if invalid."""
    changes = {f: v for k, v in setting.items() for f in KNOBS[k][0]}
    try:
        return dataclasses.replace(base, **changes)
    except ValueError as e:   # ConfigError: one line
        raise UserError(f"setting {label(setting)}: {e}") from None


def label(setting: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "current"


def grid(knobs: list[tuple[str, list]]) -> list[dict]:
    """Every combination of the knob values (one dict per setting)."""
    names = [n for n, _ in knobs]
    if len(set(names)) != len(names):
        raise UserError("each --knob NAME may be given once (list its values comma-separated)")
    return [dict(zip(names, combo)) for combo in itertools.product(*(v for _, v in knobs))]


@dataclass(frozen=True)
class _Job:
    requests: tuple
    cost: object
    scheduler: object
    cache: object
    max_model_len: int
    ttft_from_admission: bool = False
    frontend: object = None      # mixdiag.tuning.frontend.FrontEndDelay, or None


def _run(job: _Job) -> dict:
    from mixdiag.tuning.replay import ModelTiming, pooled_metrics, replay, replicates

    reqs = list(job.requests)
    fe = job.frontend
    return pooled_metrics([replay(reqs, ModelTiming(job.cost, seed), job.scheduler, job.cache, job.max_model_len,
                                  ttft_from_admission=job.ttft_from_admission,
                                  frontend=None if fe is None else fe.sampler(seed))
                           for seed in range(replicates(len(reqs)))])


def sweep(requests, cost, base, cache, max_model_len: int, settings: list[dict], jobs: int = 0, *,
          ttft_from_admission: bool = False, frontend=None) -> list[dict]:
    """Replay each setting (in ``jobs`` processes; 0 = up to 2 or the CPU count); one row per setting.
    ``frontend``: the measured front-end delay added to every replayed token (frontend.py), or None."""
    cfgs = [apply(base, s) for s in settings]
    work = [_Job(tuple(requests), cost, c, cache, max_model_len, ttft_from_admission, frontend) for c in cfgs]
    jobs = jobs or min(2, os.cpu_count() or 1)
    if jobs > 1 and len(work) > 1:
        import multiprocessing

        with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=multiprocessing.get_context("fork")) as ex:
            metrics = list(ex.map(_run, work))
    else:
        metrics = [_run(w) for w in work]
    return [{"setting": s, "label": label(s), **m} for s, m in zip(settings, metrics)]


def pareto(rows: list[dict]) -> list[dict]:
    """Settings no other beats on both P99 ITL and P99 TTFT (sorted by P99 ITL)."""
    def dominated(a, b):   # b dominates a
        return (b["itl_p99_s"] <= a["itl_p99_s"] and b["ttft_p99_s"] <= a["ttft_p99_s"]
                and (b["itl_p99_s"] < a["itl_p99_s"] or b["ttft_p99_s"] < a["ttft_p99_s"]))
    front = [a for a in rows if not any(dominated(a, b) for b in rows if b is not a)]
    return sorted(front, key=lambda r: (r["itl_p99_s"], r["ttft_p99_s"]))


#: A setting whose largest replayed step holds more than this x the tokens of the largest step the
#: cost was fitted on is predicted beyond the data: bench_tune's 4000-token steps, fitted on steps of
#: <= ~540 tokens, ran 25 % slower than predicted (docs/tune.md). Recommended only when no setting
#: inside the data meets the SLOs, and then said so.
EXTRAPOLATION_LIMIT = 2.0


def extrapolated(r: dict) -> bool:
    """Whether the row's steps leave the fitted token range by more than EXTRAPOLATION_LIMIT."""
    x = r.get("extrapolation_x")
    return x is not None and math.isfinite(x) and x > EXTRAPOLATION_LIMIT


def _itl_hi(r: dict) -> float:
    """The P99 ITL a run stays under with 95 % probability (replay.pooled_metrics), else the P99."""
    v = r.get("itl_p99_hi_s")
    return v if v is not None and math.isfinite(v) else r["itl_p99_s"]


def recommend(rows: list[dict], slo_itl: float | None, slo_ttft: float | None) -> tuple[dict | None, str]:
    """The recommended row and why: among settings inside the fitted step sizes when any of them
    meets the SLOs (or, without SLOs, lies on the frontier), else among all, said in the reason."""
    inside = [r for r in rows if not extrapolated(r)]
    if inside and len(inside) < len(rows):
        rec, why = _recommend(inside, slo_itl, slo_ttft)
        if rec is not None:
            return rec, why + f" (settings whose steps exceed {EXTRAPOLATION_LIMIT:g}x the fitted step sizes left out)"
        rec, why = _recommend(rows, slo_itl, slo_ttft)
        if rec is not None and extrapolated(rec):
            why += (f"; its steps reach {rec['extrapolation_x']:.1f}x the largest step the cost was fitted on: "
                    "a prediction beyond your data")
        return rec, why
    return _recommend(rows, slo_itl, slo_ttft)


def _recommend(rows: list[dict], slo_itl: float | None, slo_ttft: float | None) -> tuple[dict | None, str]:
    """The recommended row and why (None when no setting meets the SLOs). ITL is judged by its
    95 % run bound (:func:`_itl_hi`): a P99 on the cliff of a ~1 % slow share is not a promise."""
    ok = [r for r in rows if (slo_itl is None or _itl_hi(r) <= slo_itl)
          and (slo_ttft is None or r["ttft_p99_s"] <= slo_ttft)]
    slos = " and ".join(s for s in (f"P99 ITL <= {slo_itl:g} s" if slo_itl is not None else "",
                                    f"P99 TTFT <= {slo_ttft:g} s" if slo_ttft is not None else "") if s)
    if not ok:
        best = min(rows, key=lambda r: max(_itl_hi(r) / (slo_itl or math.inf), r["ttft_p99_s"] / (slo_ttft or math.inf)))
        return None, f"no setting meets {slos}; closest: {best['label']}"
    if slo_ttft is not None and slo_itl is None:
        return min(ok, key=lambda r: (_itl_hi(r), r["ttft_p99_s"])), f"lowest P99 ITL (95 % run bound) with {slos}"
    if slo_itl is not None and slo_ttft is None:
        return min(ok, key=lambda r: (r["ttft_p99_s"], _itl_hi(r))), f"lowest P99 TTFT with {slos}"
    if slo_itl is not None:
        return max(ok, key=lambda r: (r["throughput_tok_s"], -_itl_hi(r))), f"highest throughput with {slos}"
    bi = min(r["itl_p99_s"] for r in rows) or 1e-9
    bt = min(r["ttft_p99_s"] for r in rows) or 1e-9
    return (min(pareto(rows), key=lambda r: r["itl_p99_s"] / bi + r["ttft_p99_s"] / bt),
            "no SLO given: the frontier point nearest both minima")


def change(current: dict, rec: dict | None) -> dict | None:
    """Predicted change from the current setting to the recommended one (values and ratios)."""
    if rec is None:
        return None
    out = {}
    for k in ("itl_p99_s", "ttft_p99_s", "throughput_tok_s"):
        a, b = current[k], rec[k]
        out[k] = {"current": a, "recommended": b, "ratio": b / a if a else None}
    return out
