"""``mixdiag serve``: the reference engine behind an OpenAI-compatible HTTP server (docs/serving.md).

Imports of torch, starlette and uvicorn happen inside :func:`run`, so ``mixdiag --help`` stays fast.
"""
from __future__ import annotations


def register(sub, common):
    p = sub.add_parser("serve", parents=[common], help="serve the reference engine over the OpenAI HTTP API",
                       description="Run the reference engine as an OpenAI-compatible server: POST /v1/completions "
                                   "and /v1/chat/completions (streamed or not), GET /v1/models, /health, /metrics. "
                                   "SIGTERM/Ctrl-C drain open streams, then exit.")
    p.add_argument("--scenario", default="mixed-default", metavar="NAME|FILE",
                   help="engine config (model, cache, scheduler, faults) from a shipped scenario or .toml; its "
                        "workload is ignored (default: mixed-default)")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed (sampling)")
    p.add_argument("--scheduler", default=None, metavar="POLICY",
                   help="override the scenario's policy: token_budget | mix_running | prefill_first")
    p.add_argument("--chunk-size", type=int, default=None, metavar="TOKENS",
                   help="prefill chunk / token budget per step (max_num_batched_tokens, chunked_prefill_size)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (0 = any free port; the URL is printed)")
    p.add_argument("--model-name", default="mixdiag-tiny", help="the model id clients must send (default mixdiag-tiny)")
    p.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="requests admitted and unfinished at most; more get HTTP 429 (default 256)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="per-request limit from admission to last token (default 600)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGTERM, how long open streams may finish (default 30)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="directory for --log-format, --profile, --scrape-interval files, the final metrics.prom and, "
                        "at shutdown, truth.csv + steps.csv (the server's ground truth, wall clock)")
    g = p.add_argument_group("instrumentation (as mixdiag run)")
    g.add_argument("--log-format", choices=("vllm", "sglang", "both"), default=None,
                   help="write vLLM and/or SGLang batch log lines to DIR/engine.log")
    g.add_argument("--decode-log-interval", type=int, metavar="N", default=40)
    g.add_argument("--profile", metavar="START:STOP", default=None,
                   help="PyTorch-profiler trace of steps START..STOP-1 to DIR/trace.json")
    g.add_argument("--profile-light", action="store_true", help="no per-operator events in the --profile trace")
    g.add_argument("--scrape-interval", type=float, metavar="S", default=None,
                   help="also write /metrics every S seconds to DIR/scrapes/<unix_time>.prom")
    g.add_argument("--metrics-dialect", choices=("mixdiag", "vllm", "sglang"), default="mixdiag",
                   help="series /metrics and the scrapes expose: mixdiag's own, or exactly vLLM's / SGLang's")
    g.add_argument("--nvtx", action="store_true", default=True, help="NVTX ranges in domain 'mixdiag' (default on)")
    g.add_argument("--no-nvtx", dest="nvtx", action="store_false", help="no NVTX ranges")
    p.set_defaults(func=run)


def run(args, console):
    from mixdiag.engine.serving.launch import ServeOptions, serve
    from mixdiag.engine.serving.server import ServerConfig
    from mixdiag.commands.flags import instrumentation_config

    opts = ServeOptions(scenario=args.scenario, seed=args.seed, policy=args.scheduler, chunk_size=args.chunk_size,
                        out_dir=args.out)
    scfg = ServerConfig(host=args.host, port=args.port, model_name=args.model_name, max_queue=args.max_queue,
                        request_timeout_s=args.request_timeout, drain_timeout_s=args.drain_timeout)
    icfg = instrumentation_config(args)
    return serve(opts, scfg, icfg)   # the "listening on URL" line always goes to stderr (scripts wait for it)
