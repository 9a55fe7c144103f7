"""``mixdiag nvml-sample --out FILE.csv``: sample a GPU's SM activity through NVML (GPU machines).

GPM ``SM_UTIL`` on Hopper and newer (the share of SMs busy: measured SM activity); elsewhere NVML
utilization (the share of time any kernel ran: a weaker proxy). The CSV is read back by the
``nvml-csv`` collector (``mixdiag ingest FILE.csv``, or with a run's steps to fill ``sm_active``).
"""
from __future__ import annotations

import math

from mixdiag.errors import UserError


def register(sub, common):
    p = sub.add_parser("nvml-sample", parents=[common], help="sample GPU SM activity via NVML into a CSV",
                       description="Sample one GPU's SM activity (GPM SM_UTIL on Hopper+, else NVML utilization, "
                                   "flagged weaker) every --interval seconds for --duration seconds into a new CSV "
                                   "(needs nvidia-ml-py: pip install 'mixdiag[gpu]').")
    p.add_argument("--out", required=True, metavar="FILE.csv", help="CSV to create (never overwritten)")
    p.add_argument("--device", type=int, default=0, metavar="N", help="GPU index (default 0)")
    p.add_argument("--interval", type=float, default=0.1, metavar="S", help="seconds per sample (default 0.1)")
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="seconds to sample (default 10)")
    p.add_argument("--source", choices=["auto", "gpm_sm_util", "gpu_util"], default="auto",
                   help="auto: GPM when the GPU supports it (default)")
    p.set_defaults(func=run)


def run(args, console):
    if not (args.interval > 0 and args.duration > 0 and math.isfinite(args.interval + args.duration)):
        raise UserError("--interval and --duration must be positive seconds")
    from mixdiag import gpu_probe
    from mixdiag.collectors.gpu import nvml  # pandas: imported when sampling, not for --help

    nv = gpu_probe.load_nvml()  # fail (one line) before any progress bar is drawn
    n = max(1, int(round(args.duration / args.interval)))
    values: list[float] = []
    used: list[str] = []
    with console.progress(total=n, desc=f"GPU {args.device}", unit="sample") as bar:
        def on_sample(metric, value):
            used[:] = [metric]
            values.append(value)
            bar.update()

        path = nvml.sample(args.out, device_index=args.device, interval_s=args.interval, duration_s=args.duration,
                           source=args.source, nvml=nv, on_sample=on_sample)
    ok = [v for v in values if not math.isnan(v)]
    data = {"out": str(path), "samples": len(values), "metric": used[0] if used else None,
            "quality": gpu_probe.METRICS.get(used[0]) if used else None,
            "mean": sum(ok) / len(ok) if ok else None, "max": max(ok) if ok else None}
    mean = f"{data['mean']:.3f}" if ok else "-"
    console.result(f"{path}: {len(values)} samples of {data['metric']} ({data['quality']}), mean {mean}", data)
    return 0
