"""The client's view of mixing: `mixdiag load` against `mixdiag serve`, mixed-default vs prefill_first.

Part 1 (ratio): for each scheduler the same client load over HTTP: chat streams (prompts 64-256
tokens, ``--output`` tokens, ``--chat-rate`` req/s) plus long prompts (``--long-len`` tokens,
16 output tokens, ``--long-rate`` req/s), for ``--duration`` s, both servers at ``--chunk-size``.
Prints the client P99 ITL and output tokens/s per scheduler and the ratio mixed/prefill_first
(target: P99 ITL ratio <= 0.35 at >= 0.9 the throughput), and ``below_saturation`` (both P99
TTFT <= 2 s: both kept up with the same offered load, so the comparison means something).

Why these defaults: a prefill_first stall delays one token of each running stream, so stalls are
a share ~ long-rate x ITL of all ITLs; P99 sees them only above 1 %. The tiny model decodes in
5-12 ms (with the machine's load), so that needs 2-3 long prompts/s; at 4096 tokens that is more
than the prefill capacity of 2 cores (the server saturates); 512-token prompts (chunk 128: four
chunks) keep both servers below saturation with stalls in ~2 % of the ITLs.

Part 2 (capacity): mixed-default (``--chunk-size``) under chat-only Poisson load at rising rates
(``--rates``); the sustainable rate is the highest whose client P99 TTFT stays <= 2 s (every
request answered).

Servers run as subprocesses (``mixdiag serve --port 0``) on 127.0.0.1. ``--json`` ends with one
JSON line.

    .venv/bin/python benchmarks/bench_serve.py [--duration 20] [--rates 2,4,8,12,16] [--json]

Measured (2 shared CPU cores, tiny model; docs/serving.md): see the figures there.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time

from mixdiag.loadgen import Dist, LoadConfig, run_load, summarize

TTFT_LIMIT_S = 2.0


def start_server(policy: str, chunk: int | None = None) -> tuple[subprocess.Popen, str]:
    extra = ["--chunk-size", str(chunk)] if chunk else []
    proc = subprocess.Popen([sys.executable, "-m", "mixdiag", "serve", "--scenario", "mixed-default", "--scheduler",
                             policy, "--port", "0", "--no-nvtx", "--max-queue", "4096", "--drain-timeout", "5", *extra],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    line = proc.stderr.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"server did not start: {line}")
    return proc, m.group(1)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _loads(cfgs: list[LoadConfig]) -> list[dict]:
    recs: list[dict] = []

    def write(r):
        if r.get("type") == "request":
            recs.append(r)

    await asyncio.gather(*(run_load(c, write) for c in cfgs))
    return recs


def measure(url: str, cfgs: list[LoadConfig]) -> dict:
    t0 = time.time()
    recs = asyncio.run(_loads(cfgs))
    s = summarize(recs, time.time() - t0)
    s["statuses"] = {}
    for r in recs:
        s["statuses"][r["status"]] = s["statuses"].get(r["status"], 0) + 1
    s["lost_tokens"] = sum(abs(r.get("lost_tokens") or 0) for r in recs)
    return s


def judge(mix: dict, pf: dict) -> dict:
    """Ratios of the two servers' summaries and whether the target is met.

    The comparison means something only when both servers kept up with the same offered load (a
    saturated server queues arrivals: its TTFT grows with the run; both P99 TTFT under the limit =
    both kept up), so the target is met only below saturation; above it the verdict says so.
    """
    ratio = mix["itl_s"]["p99"] / pf["itl_s"]["p99"]
    tput = mix["output_tokens_per_s"] / pf["output_tokens_per_s"]
    below = all(p["ttft_s"]["p99"] is not None and p["ttft_s"]["p99"] <= TTFT_LIMIT_S for p in (mix, pf))
    ratios_ok = ratio <= 0.35 and tput >= 0.9
    verdict = ("met" if ratios_ok else "NOT met") if below else \
        f"NOT met: a server saturated (P99 TTFT > {TTFT_LIMIT_S:g} s), the ratios compare nothing"
    return {"p99_itl_ratio": ratio, "throughput_ratio": tput, "below_saturation": below,
            "target_met": ratios_ok and below, "verdict": verdict}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--chat-rate", type=float, default=2.0)
    ap.add_argument("--output", type=int, default=300)
    ap.add_argument("--long-rate", type=float, default=3.0)
    ap.add_argument("--long-len", type=int, default=512)
    ap.add_argument("--rates", default="2,4,8,12,16")
    ap.add_argument("--rate-duration", type=float, default=12.0)
    ap.add_argument("--chunk-size", type=int, default=128, help="token budget per step, both parts (scenario: 512)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    out: dict = {"policies": {}}
    for policy in ("token_budget", "prefill_first"):
        proc, url = start_server(policy, args.chunk_size)
        try:
            chat = LoadConfig(url=url, rate=args.chat_rate, duration_s=args.duration, model="mixdiag-tiny",
                              prompt_len=Dist.parse("uniform:64:256"), output_len=Dist.parse(str(args.output)), seed=1)
            long = LoadConfig(url=url, rate=args.long_rate, duration_s=args.duration, model="mixdiag-tiny",
                              prompt_len=Dist("fixed", args.long_len), output_len=Dist("fixed", 16), seed=2,
                              arrival="constant")
            out["policies"][policy] = measure(url, [chat, long])
        finally:
            stop_server(proc)
        s = out["policies"][policy]
        print(f"{policy:14s} ITL p50 {s['itl_s']['p50'] * 1e3:7.1f} ms p99 {s['itl_s']['p99'] * 1e3:7.1f} ms  "
              f"TTFT p99 {s['ttft_s']['p99']:.2f} s  {s['output_tokens_per_s']:.0f} tok/s  {s['statuses']}",
              file=sys.stderr)
    out.update(judge(out["policies"]["token_budget"], out["policies"]["prefill_first"]))
    print(f"mixed/prefill_first: P99 ITL x{out['p99_itl_ratio']:.2f}, throughput x{out['throughput_ratio']:.2f} "
          f"(target <= 0.35 at >= 0.9: {out['verdict']})", file=sys.stderr)

    sweep, sustainable = [], None
    proc, url = start_server("token_budget", args.chunk_size)
    try:
        for rate in [float(r) for r in args.rates.split(",") if r.strip()]:   # --rates '' skips part 2
            cfg = LoadConfig(url=url, rate=rate, duration_s=args.rate_duration, model="mixdiag-tiny",
                             prompt_len=Dist.parse("uniform:64:256"), output_len=Dist.parse(str(args.output)), seed=3)
            s = measure(url, [cfg])
            ok = s["statuses"].get("ok", 0) == s["requests"] and s["ttft_s"]["p99"] is not None \
                and s["ttft_s"]["p99"] <= TTFT_LIMIT_S
            sweep.append({"rate": rate, "ttft_p99_s": s["ttft_s"]["p99"], "itl_p99_s": s["itl_s"]["p99"],
                          "requests_per_s": s["requests_per_s"], "ok": ok, "statuses": s["statuses"]})
            print(f"rate {rate:5.1f} req/s: TTFT p99 {s['ttft_s']['p99']:.2f} s, ITL p99 "
                  f"{s['itl_s']['p99'] * 1e3:.1f} ms, {s['statuses']}", file=sys.stderr)
            if not ok:
                break
            sustainable = rate
    finally:
        stop_server(proc)
    out["rate_sweep"] = sweep
    out["sustainable_req_per_s"] = sustainable
    print(f"sustainable before P99 TTFT > {TTFT_LIMIT_S:g} s: {sustainable} req/s", file=sys.stderr)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
