"""The ``mixdiag run`` instrumentation flags, apart from :mod:`.instrumentation` so that building the
CLI parser (``mixdiag --help``) never imports torch. Standard library only."""
from __future__ import annotations

from mixdiag.wire import DOMAIN


def add_arguments(parser) -> None:
    """Add the instrumentation flags to a ``mixdiag run``-style parser."""
    g = parser.add_argument_group("instrumentation")
    g.add_argument("--serve", type=int, metavar="PORT", default=None,
                   help="serve Prometheus /metrics on 127.0.0.1:PORT during the run (0 = any free port)")
    g.add_argument("--linger", type=float, metavar="S", default=0.0,
                   help="keep serving /metrics S seconds after the run (with --serve)")
    g.add_argument("--log-format", choices=("vllm", "sglang", "both"), default=None,
                   help="write vLLM 'Iteration(N)' and/or SGLang 'Prefill/Decode batch' lines to DIR/engine.log")
    g.add_argument("--decode-log-interval", type=int, metavar="N", default=40,
                   help="SGLang Decode-batch line every N decode steps (SGLang's default 40)")
    g.add_argument("--profile", metavar="START:STOP", default=None,
                   help="record a PyTorch-profiler (Kineto) trace of steps START..STOP-1 to DIR/trace.json "
                        "('START:' or 'all': to the end of the run)")
    g.add_argument("--profile-light", action="store_true",
                   help="drop per-operator events from the --profile trace (keeps the step/phase ranges and GPU "
                        "kernels; for long windows)")
    g.add_argument("--scrape-interval", type=float, metavar="S", default=None,
                   help="write the engine's /metrics every S seconds to DIR/scrapes/<unix_time>.prom "
                        "(the final scrape always goes to DIR/metrics.prom)")
    g.add_argument("--metrics-dialect", choices=("mixdiag", "vllm", "sglang"), default="mixdiag",
                   help="series /metrics and the scrapes expose: mixdiag's own, or exactly vLLM's / SGLang's")
    g.add_argument("--nvtx", action="store_true", default=True, help=f"NVTX ranges in domain '{DOMAIN}' (default on)")
    g.add_argument("--no-nvtx", dest="nvtx", action="store_false", help="no NVTX ranges")
