"""``bench_tune.py --engine vllm``: does ``mixdiag tune`` predict a real vLLM 0.32?

1. Really run the vLLM testbed (``mixdiag.vllm_testbed``: ``vllm serve`` of the offline tiny Llama
   on these CPUs, ``mixdiag load`` traffic) once per ``--max-num-batched-tokens`` of ``--chunks``,
   every run with the SAME traffic seed and the same long-prompt load (the only fault), and the base
   setting (512) twice, first and last, so the repeat spans whatever the machine did in between;
2. ``mixdiag tune`` the first base run from what the run recorded: its client records
   (``client.jsonl``: requests, prompt lengths, per-token times) and vLLM's iteration records
   (``truth/iterations.log``: the engine's own step shapes and elapsed times — what the operator
   log holds with ``--enable-logging-iteration-details``), predicting P99 ITL and P99 TTFT at every
   setting;
3. compare with the real runs: median |pred - real| / real over the other settings, beside the
   **noise floor**, |repeat - first| / first of the base setting (what a perfect model would still
   show), and the base repeat's own error (the prediction of the run's own setting on fresh traffic
   timing).

Real P99s come from the client records, read exactly as ``tune`` reads its input's own
(``sweep.measured_p99``). Each run records the 1-minute load average before and after it (2 shared
cores here: the figures are a busy machine's unless the load says otherwise).

At most one vLLM runs at a time; a run is ~90 s of server start plus ``--duration`` of traffic plus
the drain. ``--keep DIR`` keeps the runs (``DIR/vllm-<chunk>-<round>``); ``--reuse DIR`` judges runs
kept earlier without starting vLLM (settings with no run there are reported as not run).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _load1() -> float:
    return round(os.getloadavg()[0], 2)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / b


def real_run(root: Path, chunk: int, tag: str, args, say) -> dict | None:
    """One testbed run at ``chunk`` into ``root/vllm-CHUNK-TAG`` (``--reuse``: read it; None if absent)."""
    out = root / f"vllm-{chunk}-{tag}"
    if args.reuse:
        if not (out / "client.jsonl").exists():
            return None
        got = json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else {}
    else:
        from mixdiag.vllm_testbed import driver
        from mixdiag.vllm_testbed.config import ServerConfig, TestbedConfig

        cfg = TestbedConfig(duration_s=args.duration, seed=args.seed, faults=("long_prompts",),
                            long_prompt_gap_s=getattr(args, "long_gap", None),
                            server=ServerConfig(max_num_batched_tokens=chunk))
        from mixdiag.errors import UserError

        l0, t = _load1(), time.perf_counter()
        try:
            res = driver.run(cfg, out, say=say)
        except UserError as e:   # no vLLM environment, a server that died: one line, no traceback
            raise SystemExit(f"vLLM run chunk_size={chunk} round {tag}: {e}") from None
        got = {"wall_s": round(time.perf_counter() - t, 1), "load1_before": l0, "load1_after": _load1(),
               "errors": list(res.errors)}
        (out / "bench.json").write_text(json.dumps(got))
    return {"chunk_size": chunk, "round": tag, **_real_p99(out), **got, "out": str(out)}


def _real_p99(run: Path) -> dict:
    from mixdiag.collectors import load
    from mixdiag.tuning import sweep, traffic

    tl = load(run / "client.jsonl")
    m = sweep.measured_p99(tl, traffic.from_timeline(tl))
    return {"itl_p99_s": m["itl_p99_s"], "ttft_p99_s": m["ttft_p99_s"]}


def tune(run: Path, chunks: list[int], base: int) -> dict:
    """``mixdiag tune`` of a run's client records + iteration records, as a user would call it."""
    cmd = [sys.executable, "-m", "mixdiag", "tune", str(run / "client.jsonl"), str(run / "truth" / "iterations.log"),
           "--knob", "chunk_size=" + ",".join(map(str, chunks)), "--current", f"chunk_size={base}", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"mixdiag tune failed: {(p.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(p.stdout)


def main(args, note) -> dict:
    """Run (or reuse) the real runs, tune from the first base run, print and return the figures."""
    import tempfile

    chunks = sorted({int(c) for c in args.chunks.split(",")} | {args.base})
    order = [(args.base, "1")] + [(c, "1") for c in chunks if c != args.base] + \
            [(args.base, str(k + 2)) for k in range(max(args.rounds, 2) - 1)]
    with tempfile.TemporaryDirectory(prefix="bench_tune_vllm_") as d:
        root = Path(args.reuse or args.keep or d)
        root.mkdir(parents=True, exist_ok=True)
        runs: dict[int, list[dict]] = {c: [] for c in chunks}
        for c, tag in order:
            r = real_run(root, c, tag, args, note)
            if r is None:
                note(f"  chunk_size={c} round {tag}: no run in {root}")
                continue
            runs[c].append(r)
            note(f"  real chunk_size={c} (round {tag}): P99 ITL {r['itl_p99_s'] * 1e3:.1f} ms, P99 TTFT "
                 f"{r['ttft_p99_s']:.2f} s (load {r.get('load1_before')} -> {r.get('load1_after')})")
        if not runs[args.base]:
            raise SystemExit(f"no run of the base setting {args.base}: nothing to tune from")
        first = runs[args.base][0]
        l0 = _load1()
        res = tune(Path(first["out"]), chunks, args.base)
        pred = {r["setting"]["chunk_size"]: r for r in res["settings"]}
        cm = res["cost_model"]
        note(f"tuned from round 1 of chunk_size={args.base} in {res['seconds']:.1f} s (load {l0}); cost model "
             f"{cm['kind']}, R² {cm.get('r2', float('nan')):.3f}, held-out MAPE "
             f"{100 * cm.get('mape_heldout', float('nan')):.1f} %, context {cm.get('context')}")
        rows = []
        for c in chunks:
            for r in runs[c]:
                p = pred[c]
                row = {k: v for k, v in r.items() if k != "out"}
                row.update(tuned_from=r is first, pred_itl_p99_s=p["itl_p99_s"], pred_ttft_p99_s=p["ttft_p99_s"],
                           err_itl=_rel(p["itl_p99_s"], r["itl_p99_s"]), err_ttft=_rel(p["ttft_p99_s"], r["ttft_p99_s"]))
                rows.append(row)
                note(f"chunk {c:5d} r{r['round']}{' (tuned from)' if r is first else ''}: P99 ITL pred "
                     f"{p['itl_p99_s'] * 1e3:6.1f} real {r['itl_p99_s'] * 1e3:6.1f} ms ({100 * row['err_itl']:5.1f} %); "
                     f"P99 TTFT pred {p['ttft_p99_s']:.2f} real {r['ttft_p99_s']:.2f} s ({100 * row['err_ttft']:5.1f} %); "
                     f"load {r.get('load1_before')}-{r.get('load1_after')}")
    others = [r for r in rows if r["chunk_size"] != args.base]
    repeats = runs[args.base][1:]
    med = (lambda xs: statistics.median(xs) if xs else None)
    out = {"engine": "vllm", "base_chunk": args.base, "seed": args.seed, "duration_s": args.duration,
           "long_prompt_gap_s": getattr(args, "long_gap", None), "runs": rows,
           "median_err_itl_p99": med([r["err_itl"] for r in others]),
           "median_err_ttft_p99": med([r["err_ttft"] for r in others]),
           "base_repeat_err_itl_p99": med([r["err_itl"] for r in rows if r["chunk_size"] == args.base and not r["tuned_from"]]),
           "base_repeat_err_ttft_p99": med([r["err_ttft"] for r in rows if r["chunk_size"] == args.base and not r["tuned_from"]]),
           "noise_floor": {m: med([_rel(r[f"{m}_p99_s"], first[f"{m}_p99_s"]) for r in repeats]) for m in ("itl", "ttft")},
           "target": 0.10, "cost_model": res["cost_model"], "notes": res["notes"],
           "loadavg_1m_end": _load1(), "loadavg": list(os.getloadavg()), "cpu_count": os.cpu_count()}
    pct = (lambda x: "n/a" if x is None else f"{100 * x:.1f} %")
    note(f"noise floor (base setting, |repeat - first| / first): P99 ITL {pct(out['noise_floor']['itl'])}, "
         f"P99 TTFT {pct(out['noise_floor']['ttft'])}; base repeat predicted within {pct(out['base_repeat_err_itl_p99'])} "
         f"/ {pct(out['base_repeat_err_ttft_p99'])}")
    note(f"median abs rel error over the other settings ({len(others)} runs): P99 ITL {pct(out['median_err_itl_p99'])}, "
         f"P99 TTFT {pct(out['median_err_ttft_p99'])} (target <= 10 % on P99 ITL on a quiet machine); load average "
         f"now {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    return out
