"""A streaming load generator for OpenAI-compatible servers (``mixdiag load``), recording what clients see.

Requests arrive as a Poisson process (exponential gaps, mean 1/rate) or at a constant rate (the
first at once, ``rate x duration_s`` in all) for ``duration_s``; at most ``max_concurrency`` are open at once (a later arrival waits for a slot,
and its record keeps both its scheduled and its actual start; one whose slot frees only after
``duration_s`` is not sent and recorded as ``not_sent``, so a run ends by ``duration_s`` plus the
longest request). Each request streams
``/v1/completions`` with a prompt of random token ids (``prompt_len`` of them, ids drawn from
``token_range``: every byte-level vocabulary has them) and ``max_tokens`` from ``output_len`` with
``ignore_eos`` so lengths are what was asked.

Output: JSON lines. A ``header`` record, one ``request`` record per request, a ``summary`` record.
A request record holds wall-clock (unix) seconds: ``start_s`` (request sent), ``ttft_s``,
``token_times_s`` (arrival of every streamed chunk that carried a choice - one engine step's
tokens), ``itls_s`` (gaps between them), ``status`` (``ok``, ``http_<code>``, ``timeout``,
``error``, ``not_sent``), usage counts and ``lost_tokens`` (usage's completion tokens minus tokens seen).
Times come from ``time.perf_counter`` offsets on one ``time.time`` origin, so gaps are precise and
the absolute clock is the machine's wall clock (docs/serving.md: aligning with server scrapes).
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from mixdiag.errors import UserError

FORMAT = "mixdiag-load"


@dataclass(frozen=True)
class Dist:
    """A length distribution: ``N`` | ``uniform:LO:HI`` | ``normal:MEAN:STD`` | ``exp:MEAN`` (all >= 1)."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "Dist":
        parts = str(text).split(":")
        try:
            nums = [float(x) for x in parts[1:]] if len(parts) > 1 else [float(parts[0])]
        except ValueError:
            raise UserError(f"bad length distribution {text!r}: use N, uniform:LO:HI, normal:MEAN:STD or exp:MEAN") from None
        kind = parts[0] if len(parts) > 1 else "fixed"
        want = {"fixed": 1, "uniform": 2, "normal": 2, "exp": 1}
        if kind not in want or len(nums) != want[kind]:
            raise UserError(f"bad length distribution {text!r}: use N, uniform:LO:HI, normal:MEAN:STD or exp:MEAN")
        if nums[0] < 1 or (kind == "uniform" and nums[1] < nums[0]) or (kind == "normal" and nums[1] < 0):
            raise UserError(f"bad length distribution {text!r}: lengths must be >= 1 and LO <= HI")
        return cls(kind, nums[0], nums[1] if len(nums) > 1 else 0.0)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            v = self.a
        elif self.kind == "uniform":
            v = rng.uniform(self.a, self.b)
        elif self.kind == "normal":
            v = rng.gauss(self.a, self.b)
        else:
            v = rng.expovariate(1.0 / self.a)
        return max(1, int(round(v)))

    def __str__(self) -> str:
        return {"fixed": f"{self.a:g}", "uniform": f"uniform:{self.a:g}:{self.b:g}",
                "normal": f"normal:{self.a:g}:{self.b:g}", "exp": f"exp:{self.a:g}"}[self.kind]


@dataclass(frozen=True)
class LoadConfig:
    """One load run; validated on construction."""

    url: str
    rate: float                      # requests per second
    duration_s: float
    prompt_len: Dist = Dist("fixed", 128)
    output_len: Dist = Dist("fixed", 64)
    arrival: str = "poisson"         # poisson | constant
    model: str | None = None         # None: the first of GET /v1/models
    max_concurrency: int = 256
    seed: int = 0
    timeout_s: float = 300.0         # per request
    token_range: tuple[int, int] = (2, 256)
    id_prefix: str = "load"          # request ids are PREFIX-N (two loads into one file: two prefixes)

    def __post_init__(self):
        if not self.url.startswith(("http://", "https://")):
            raise UserError(f"URL must start with http:// or https://, got {self.url!r}")
        if not self.rate > 0:
            raise UserError(f"--rate must be > 0 requests/s, got {self.rate}")
        if not self.duration_s > 0:
            raise UserError(f"--duration must be > 0 seconds, got {self.duration_s}")
        if self.arrival not in ("poisson", "constant"):
            raise UserError(f"--arrival must be poisson or constant, got {self.arrival!r}")
        if self.max_concurrency < 1:
            raise UserError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if not self.timeout_s > 0:
            raise UserError(f"--timeout must be > 0 seconds, got {self.timeout_s}")

    def arrivals(self) -> list[float]:
        """Send offsets (s from start) of every request, fixed by the seed.

        Constant: exactly ``floor(rate x duration)`` requests at ``i / rate``, i = 0.. (each time from
        its integer index: summing 1/rate drifts, and the last send then lands on ``duration_s``
        itself and is dropped as not sent).
        """
        if self.arrival == "constant":
            # the epsilon absorbs the product's rounding (0.29 x 100 = 28.999999999999996)
            n = math.floor(self.rate * self.duration_s + 1e-9)
            return [i / self.rate for i in range(n)]
        rng = random.Random(self.seed)
        out, t = [], 0.0
        while True:
            t += rng.expovariate(self.rate)
            if t >= self.duration_s:
                return out
            out.append(t)


@dataclass
class _Clock:
    """Wall-clock seconds from one ``time.time`` origin plus ``perf_counter`` offsets."""

    wall0: float = field(default_factory=time.time)
    perf0: float = field(default_factory=time.perf_counter)

    def now(self) -> float:
        return self.wall0 + (time.perf_counter() - self.perf0)


async def _one(client, cfg: LoadConfig, model: str, idx: int, prompt: list[int], max_tokens: int,
               scheduled_s: float, clock: _Clock) -> dict:
    rec = {"type": "request", "request_id": f"{cfg.id_prefix}-{idx}", "scheduled_s": scheduled_s, "start_s": clock.now(),
           "prompt_tokens": len(prompt), "max_tokens": max_tokens, "status": "ok", "error": None,
           "ttft_s": None, "token_times_s": [], "itls_s": [], "output_tokens": None, "usage": None}
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    times = rec["token_times_s"]
    done = False
    try:
        async with client.stream("POST", cfg.url.rstrip("/") + "/v1/completions", json=body,
                                 timeout=cfg.timeout_s) as resp:
            if resp.status_code != 200:
                rec["status"] = f"http_{resp.status_code}"
                raw = (await resp.aread()).decode(errors="replace")
                try:
                    rec["error"] = json.loads(raw)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    rec["error"] = raw[:300]
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    t = clock.now()
                    msg = json.loads(data)
                    if "error" in msg:
                        rec["status"], rec["error"] = "error", str(msg["error"].get("message"))
                        break
                    if msg.get("choices"):
                        times.append(t)
                    if msg.get("usage"):
                        rec["usage"] = msg["usage"]
                if rec["status"] == "ok" and not done:
                    rec["status"], rec["error"] = "error", "stream ended without [DONE]"
    except asyncio.TimeoutError:
        rec["status"], rec["error"] = "timeout", f"no answer within {cfg.timeout_s:g} s"
    except Exception as e:  # connection refused/reset, malformed chunk: recorded, the run goes on
        import httpx

        rec["status"] = "timeout" if isinstance(e, httpx.TimeoutException) else "error"
        rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    rec["end_s"] = clock.now()
    if times:
        rec["ttft_s"] = times[0] - rec["start_s"]
        rec["itls_s"] = [b - a for a, b in zip(times, times[1:])]
    if rec["usage"]:
        rec["output_tokens"] = int(rec["usage"].get("completion_tokens", 0))
        rec["lost_tokens"] = rec["output_tokens"] - len(times)
    return rec


def _model(client_sync_get, url: str) -> str:
    try:
        data = client_sync_get(url.rstrip("/") + "/v1/models").json()
        return data["data"][0]["id"]
    except Exception as e:
        raise UserError(f"{url}: cannot list models ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                        "is the server up? (or pass --model)") from None


async def run_load(cfg: LoadConfig, write: Callable[[dict], None], progress=None) -> dict:
    """Send the load, pass every record to ``write`` (header, requests in completion order, summary)."""
    import httpx

    model = cfg.model
    if model is None:
        model = _model(lambda u: httpx.get(u, timeout=10), cfg.url)
    rng = random.Random(cfg.seed + 1)
    lo, hi = cfg.token_range
    offsets = cfg.arrivals()
    clock = _Clock()
    write({"type": "header", "format": FORMAT, "version": 1, "url": cfg.url, "model": model, "rate": cfg.rate,
           "arrival": cfg.arrival, "duration_s": cfg.duration_s, "prompt_len": str(cfg.prompt_len),
           "output_len": str(cfg.output_len), "max_concurrency": cfg.max_concurrency, "seed": cfg.seed,
           "clock": "unix", "started_s": clock.wall0, "planned_requests": len(offsets)})
    sem = asyncio.Semaphore(cfg.max_concurrency)
    statuses: dict[str, int] = {}
    lost = 0
    limits = httpx.Limits(max_connections=cfg.max_concurrency, max_keepalive_connections=cfg.max_concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=cfg.timeout_s) as client:
        async def fire(i: int, off: float):
            nonlocal lost
            prompt = [rng.randrange(lo, hi) for _ in range(cfg.prompt_len.sample(rng))]
            max_tokens = cfg.output_len.sample(rng)
            delay = off - (time.perf_counter() - clock.perf0)
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                if time.perf_counter() - clock.perf0 >= cfg.duration_s:
                    # its slot freed only after the sending window: not sent, so the run stays bounded
                    rec = {"type": "request", "request_id": f"{cfg.id_prefix}-{i}", "scheduled_s": clock.wall0 + off,
                           "start_s": None, "end_s": None, "status": "not_sent", "error": "no free slot before "
                           "--duration ended (server slower than the offered rate)", "prompt_tokens": len(prompt),
                           "max_tokens": max_tokens, "ttft_s": None, "token_times_s": [], "itls_s": [],
                           "output_tokens": None, "usage": None}
                else:
                    rec = await _one(client, cfg, model, i, prompt, max_tokens, clock.wall0 + off, clock)
            statuses[rec["status"]] = statuses.get(rec["status"], 0) + 1
            lost += abs(rec.get("lost_tokens") or 0)
            write(rec)
            if progress is not None:
                progress.update(1)
            return rec

        recs = await asyncio.gather(*(fire(i, off) for i, off in enumerate(offsets)))
    summary = summarize(recs, clock.now() - clock.wall0)
    summary.update({"type": "summary", "statuses": statuses, "lost_tokens": lost})
    write(summary)
    return summary


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(recs: list[dict], wall_s: float) -> dict:
    """Client-side quantiles and throughput over the ``ok`` requests."""
    ok = [r for r in recs if r["status"] == "ok"]
    itls = [x for r in ok for x in r["itls_s"]]
    ttfts = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    out_tok = sum(r["output_tokens"] or 0 for r in ok)
    sent = [r for r in recs if r["start_s"] is not None]
    span = (max(r["end_s"] for r in sent) - min(r["start_s"] for r in sent)) if sent else 0.0
    return {"requests": len(recs), "ok": len(ok), "wall_s": wall_s, "span_s": span,
            "output_tokens": out_tok, "output_tokens_per_s": out_tok / span if span > 0 else None,
            "requests_per_s": len(ok) / span if span > 0 else None,
            "ttft_s": {"p50": _q(ttfts, 0.5), "p99": _q(ttfts, 0.99)},
            "itl_s": {"p50": _q(itls, 0.5), "p99": _q(itls, 0.99), "max": max(itls) if itls else None,
                      "count": len(itls)}}


def as_dict(cfg: LoadConfig) -> dict:
    d = asdict(cfg)
    d["prompt_len"], d["output_len"] = str(cfg.prompt_len), str(cfg.output_len)
    return d
