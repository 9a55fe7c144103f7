"""``mixdiag testbed vllm``: run a real vLLM (the ``.venv-vllm`` that ``make vllm-env`` builds) under
traffic and injected faults, and write scrapes, the operator log, client records and truth.
"""
from __future__ import annotations

from pathlib import Path

from mixdiag.errors import UserError


def register(sub, common):
    p = sub.add_parser("testbed", parents=[common], help="run a real engine under load and faults, with truth",
                       description="Start a real engine, drive traffic and faults, and write a capture "
                                   "(scrapes, operator log, client records) plus the engine's own truth.")
    engines = p.add_subparsers(dest="engine", metavar="ENGINE")
    v = engines.add_parser("vllm", parents=[common], help="vLLM 0.32 on CPU with a small offline Llama",
                           description="vllm serve on 127.0.0.1 (a free port), `mixdiag load` traffic, /metrics "
                                       "scraped into DIR/scrapes, the operator log in DIR/vllm.log, client records "
                                       "in DIR/client.jsonl, truth in DIR/truth/ (iterations.log, faults.csv). "
                                       "Faults are drawn from --seed. Everything started is stopped on exit or Ctrl+C.")
    from mixdiag.vllm_testbed.config import FAULTS

    v.add_argument("--out", required=True, metavar="DIR", help="run directory to write (new or empty)")
    v.add_argument("--duration", type=float, default=60.0, metavar="S", help="seconds of traffic (default 60)")
    v.add_argument("--faults", default="long_prompts", metavar="LIST",
                   help=f"comma-separated, or none: {', '.join(FAULTS)} (default long_prompts)")
    v.add_argument("--seed", type=int, default=0, help="draws the fault schedule and the traffic (default 0)")
    v.add_argument("--rate", type=float, default=2.5, metavar="R", help="base load, requests/s (default 2.5)")
    v.add_argument("--streams", type=int, default=12, metavar="N", help="base load's open streams at most (default 12)")
    v.add_argument("--max-num-batched-tokens", type=int, default=512, metavar="N",
                   help="vLLM's token budget per step (default 512; batch_limits draws its own)")
    v.add_argument("--max-num-seqs", type=int, default=32, metavar="N", help="vLLM's sequences per step (default 32)")
    v.add_argument("--scrape-interval", type=float, default=1.0, metavar="S", help="/metrics every S seconds (default 1)")
    v.add_argument("--live-analyze", action="store_true",
                   help="also run `mixdiag analyze <url>/metrics` beside the load; its --json goes to live/analyze.json")
    v.add_argument("--venv", default=None, metavar="DIR", help="the vLLM environment (default .venv-vllm)")
    v.set_defaults(func=run)
    p.set_defaults(func=_no_engine)


def _no_engine(args, console):
    raise UserError("choose an engine: mixdiag testbed vllm --out DIR ... (see 'mixdiag testbed vllm --help')")


def run(args, console):
    from mixdiag.vllm_testbed import driver
    from mixdiag.vllm_testbed.config import ServerConfig, TestbedConfig, TrafficConfig, parse_faults

    cfg = TestbedConfig(duration_s=args.duration, seed=args.seed, faults=parse_faults(args.faults),
                        scrape_interval_s=args.scrape_interval, live_analyze=args.live_analyze,
                        traffic=TrafficConfig(rate=args.rate, max_concurrency=args.streams),
                        server=ServerConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                                            max_num_seqs=args.max_num_seqs))
    result = driver.run(cfg, Path(args.out), venv=Path(args.venv) if args.venv else None, say=console.note)
    reqs = ", ".join(f"{k} {v}" for k, v in result.requests.items())
    human = (f"wrote {result.out}: {result.scrapes} scrapes ({result.scrape_failures} failed), requests per "
             f"stream: {reqs}; {result.iterations} engine iterations and {result.faults} faults in truth/")
    if result.errors:
        human += "\n" + "\n".join(f"warning: {e}" for e in result.errors)
    summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(result).items()}
    console.result(human + f"\nnext: mixdiag analyze {result.out}/scrapes {result.out}/vllm.log", summary)
    return 0
