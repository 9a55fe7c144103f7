"""A generated vLLM log that mixes every line kind the iteration fast path must hand back to the
per-line path: DP ranks, ``Engine N`` keys, a New-Year rollover, impossible dates, untimed and
docker-stamped lines, CRLF, ANSI colours, latin-1 bytes, binary garbage, a CUDA-graph table closed
by an Iteration line, SchedulerIterationDetails, Iteration lines with trailing text, equal and
backward times."""
from __future__ import annotations

import random

PROC = "(EngineCore_DP{dp} pid=77) INFO {mo:02d}-{d:02d} {hms}{frac} [core.py:349] "


def _iter(n: int, ctx: int, gen: int, ms: float) -> str:
    return (f"Iteration({n}): {1 if ctx else 0} context requests, {ctx} context tokens, {gen} generation "
            f"requests, {gen} generation tokens, iteration elapsed time: {ms:.2f} ms")


def mixed_log(n: int = 3000, seed: int = 7) -> bytes:
    """``n`` Iteration lines (most in the fast shape) between every other kind of vLLM line."""
    rnd = random.Random(seed)
    out: list[bytes] = [("INFO " + _iter(0, 0, 4, 1.0)).encode(),   # no time yet: placed at the first time
                        _iter(1, 16, 0, 2.0).encode()]
    mo, d, s = 12, 31, 23 * 3600 + 59 * 60 + 30
    for i in range(2, n):
        s += rnd.choice((0, 0, 1))
        if s >= 86400:  # New Year: months run backwards, the year rolls over
            s, mo, d = 0, 1, 1
        hms = f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
        frac = rnd.choice(("", f".{rnd.randrange(1000):03d}", f".{rnd.randrange(10 ** 6):06d}"))
        dp = rnd.choice((0, 0, 1))
        head = PROC.format(dp=dp, mo=mo, d=d, hms=hms, frac=frac)
        ctx = rnd.choice((0, 0, 0, 128, 2048))
        gen = rnd.choice((0, 8, 32))
        line = head + _iter(i, ctx, gen, rnd.choice((0.5, 11.0, 95.25)))
        r = rnd.random()
        if r < 0.02:
            line = "INFO " + f"{mo:02d}-{d:02d} {hms} [core.py:1] " + _iter(i, ctx, gen, 3.0)  # no process tag
        elif r < 0.03:
            line = head.replace(f"{mo:02d}-{d:02d}", f"{mo:02d}-32") + _iter(i, ctx, gen, 3.0)  # impossible date
        elif r < 0.04:
            line = f"2026-01-0{1 + i % 3}T00:00:0{i % 10}.5Z " + line  # docker --timestamps
        elif r < 0.05:
            line += "\r"
        elif r < 0.06:
            line = line.replace("INFO", "\x1b[32mINFO\x1b[0m", 1)
        elif r < 0.07:
            line = head + "Engine 001: " + _iter(i, ctx, gen, 3.0)
        elif r < 0.08:
            line += " (and more)"
        elif r < 0.085:
            line = line[: len(line) // 2]  # cut mid-way
        out.append(line.encode())
        if r > 0.97:
            out.append(head.encode() + b"EPLB step: avg_tokens=10.00, max_tokens=25, balancedness=0.4000")
        elif r > 0.95:
            out.append(head.encode() + b"KV Transfer metrics: Num successful transfers=2, Avg xfer time (ms)=3.5, "
                       b"Avg MB per transfer=12.0")
        elif r > 0.94:
            out.append(head.replace(f"DP{dp}", "DP0").encode() + "Engine 000: Avg prompt throughput: 10.0 tokens/s, "
                       "Avg generation throughput: 5.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs, Preemptions: 1, "
                       "GPU KV cache usage: 10.0%, Prefix cache hit rate: 0.0%".encode())
        elif r > 0.935:
            out += [head.encode() + b"**CUDAGraph Stats:**", b"", b"| Unpadded Tokens | Padded Tokens | Num Paddings "
                    b"| Runtime Mode | Count |", b"|---|---|---|---|---|", b"| 8 | 8 | 0 | FULL | 40 |"]
        elif r > 0.93:
            out.append(head.encode() + f"SchedulerIterationDetails(iteration_index={i}, num_ctx_requests=0, "
                       f"num_ctx_tokens=0, num_generation_requests=3, num_generation_tokens=3, elapsed_ms=1.5, "
                       f"is_dummy={'True' if i % 2 else 'False'})".encode())
        elif r > 0.925:
            out.append(head.encode() + b"Iteration(9): caf\xe9 " + _iter(i, 0, 2, 1.0).encode())  # latin-1 byte
        elif r > 0.92:
            out.append(b"\x00\x01\x02garbage\xff\xfe")
        elif r > 0.915:
            out.append(b"INFO:     127.0.0.1:1 - \"GET /metrics HTTP/1.1\" 200 OK")
    return b"\n".join(out) + b"\n"
