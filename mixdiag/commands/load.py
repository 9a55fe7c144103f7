"""``mixdiag load``: drive an OpenAI-compatible server with streaming requests, record what clients see.

The records (JSON lines, :mod:`mixdiag.loadgen`) are a Timeline source: ``mixdiag analyze FILE``.
"""
from __future__ import annotations

import json
from pathlib import Path

from mixdiag.errors import UserError
from mixdiag.fmt import ms


def register(sub, common):
    p = sub.add_parser("load", parents=[common], help="send streaming load to an OpenAI-compatible server",
                       description="Stream /v1/completions requests at URL (Poisson or constant arrivals) for a "
                                   "duration and write one JSON line per request: start, TTFT, every token's "
                                   "arrival time, ITLs, status.")
    p.add_argument("url", metavar="URL", help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--rate", type=float, required=True, metavar="R", help="requests per second")
    p.add_argument("--duration", type=float, required=True, metavar="S", help="send requests for S seconds")
    p.add_argument("--prompt-len", default="128", metavar="DIST",
                   help="prompt tokens: N | uniform:LO:HI | normal:MEAN:STD | exp:MEAN (default 128)")
    p.add_argument("--output-len", default="64", metavar="DIST", help="max_tokens per request, same forms (default 64)")
    p.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    p.add_argument("--max-concurrency", type=int, default=256, metavar="N",
                   help="requests open at once at most; later arrivals wait (default 256)")
    p.add_argument("--model", default=None, help="model id (default: the server's first in /v1/models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per-request limit (default 300)")
    p.add_argument("--out", required=True, metavar="FILE", help="JSON-lines records to write (must not exist)")
    p.set_defaults(func=run)


def run(args, console):
    import asyncio

    from mixdiag.loadgen import Dist, LoadConfig, run_load

    cfg = LoadConfig(url=args.url, rate=args.rate, duration_s=args.duration, prompt_len=Dist.parse(args.prompt_len),
                     output_len=Dist.parse(args.output_len), arrival=args.arrival, model=args.model,
                     max_concurrency=args.max_concurrency, seed=args.seed, timeout_s=args.timeout)
    out = Path(args.out)
    if out.exists():
        raise UserError(f"--out {out} exists; choose a new file (nothing is overwritten)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f, \
            console.progress(total=len(cfg.arrivals()), desc=f"load {cfg.rate:g} req/s", unit="req") as bar:
        def write(rec):
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            f.flush()

        summary = asyncio.run(run_load(cfg, write, progress=bar))
    itl, ttft = summary["itl_s"], summary["ttft_s"]
    human = (f"{summary['ok']}/{summary['requests']} requests ok ({', '.join(f'{k} {v}' for k, v in sorted(summary['statuses'].items()))}), "
             f"lost tokens {summary['lost_tokens']}; TTFT p50 {ms(ttft['p50'])} p99 {ms(ttft['p99'])}; "
             f"ITL p50 {ms(itl['p50'])} p99 {ms(itl['p99'])}; {summary['output_tokens']} tokens "
             f"({summary['output_tokens_per_s'] or 0:.0f} tok/s)\nwrote {out}")
    console.result(human, summary)
    return 0
