"""GPU check of the engine instrumentation's CUDA paths (run on a machine with an NVIDIA GPU).

What CPU tests cannot show: NVML SM activity measured per step (GPM SM_UTIL on Hopper+, else
utilization flagged estimated), a Kineto trace with CUDA kernels under the ``step`` ranges, and the
SM sawtooth (decode steps below steps that carry a prefill chunk). Prints one JSON line; exit 0
when every check holds, 1 when one fails, 2 when there is no GPU or nvidia-ml-py.

    .venv/bin/python scripts/gpu_check_instrumentation.py [--steps 40] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=None, help="keep the run files here (default: a temporary directory)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    from mixdiag.engine.config import CacheConfig, EngineConfig, ModelConfig
    from mixdiag.engine.core.engine import Engine
    from mixdiag.engine.telemetry.instrumentation import Instrumentation, InstrumentationConfig
    from mixdiag.engine.core.request import SamplingParams
    from mixdiag.errors import UserError

    out = Path(args.out or tempfile.mkdtemp(prefix="gpu-check-"))
    eng = Engine(EngineConfig(model=ModelConfig.preset("small"), cache=CacheConfig(num_blocks=8192), device="cuda"))
    for i in range(32):  # 32 decodes, and a long prompt arriving later to force mixed steps
        eng.add_request([2 + (i + j) % 1000 for j in range(64)], SamplingParams(max_tokens=args.steps, ignore_eos=True))
    try:
        inst = Instrumentation(InstrumentationConfig(serve_port=0, log_formats=("vllm",), profile=(4, 12)), eng, out)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    records = []
    for n in range(args.steps):
        if n == 8:
            eng.add_request([3 + j % 1000 for j in range(2048)], SamplingParams(max_tokens=4))
        records.append(eng.step())
    summary = inst.close()

    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    cats = {e.get("cat") for e in events}
    steps_in_trace = sorted({int(e["name"].split()[1]) for e in events if str(e.get("name", "")).startswith("step ")})
    sm = {k: [r.sm_active for r in records if r.kind == k] for k in ("decode", "mixed", "prefill")}
    med = {k: statistics.median(v) for k, v in sm.items() if v}
    checks = {
        "sm_source_measured_or_flagged": summary["sm_active"] in ("measured", "estimated") and "sm_active_note" not in summary,
        "sm_in_range": all(0.0 <= r.sm_active <= 1.0 for r in records),
        "sm_sawtooth": "mixed" in med and "decode" in med and med["mixed"] > med["decode"],
        "trace_has_kernels": "kernel" in cats,
        "trace_steps_window": steps_in_trace == list(range(4, 12)),
    }
    print(json.dumps({"check": "gpu-instrumentation", "device": torch.cuda.get_device_name(0),
                      "sm_source": summary["sm_active"], "sm_median_by_kind": med, "trace_categories": sorted(map(str, cats)),
                      "checks": checks, "ok": all(checks.values()), "out": str(out)}))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
