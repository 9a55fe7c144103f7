"""Front-end delay: the time between the engine step that produced a token and its arrival at the client.

A step-level replay predicts when the engine produces each token; a client measures when the token
reached it, after the API server detokenised and streamed it. When the input holds both - client
records (``mixdiag load``, vLLM bench) beside the engine's own unix-stamped iteration records - the
delay is measured here, token by token, and the replay adds it to its tokens (``replay(...,
frontend=...)``), so the P99s it predicts are the client's, as the input measured them.

The join. vLLM V1 schedules every running request in every step (running requests first, decodes
need one token each; a decode is skipped only when the budget or KV runs out), so a request's k-th
token comes from the k-th step after the one that produced its first. The anchor is the latest
step s with ``stamp[s + k] <= t_k`` for every token k (no token reaches the client before its step
is stamped); the token's delay is ``t_k - stamp[s + k]``. A decode the budget skipped (vLLM V1
schedules a partial prefill ahead of the decodes admitted after it) breaks that anchor for the tokens
before the skip, so each token is placed on the latest step that precedes both its arrival and the
next token's step (backwards from the last token): without a skip this is the anchor itself; across
one the earlier tokens are not charged the skipped step (on the 512-token run: a per-step delay P99
of 82 ms, tokens placed a 100-200 ms chunk step too early, against 11 ms). A request whose tokens
cannot be placed (a token before any step) is left out.

Why by time, not per token: on real vLLM 0.32 on 2 shared cores the API server delivers tokens in
bursts *across all streams at once* - client-wide gaps of 0.25-1.4 s while the engine ran 30-100
steps, then every held token within a millisecond (tune-vllm-gap4, chunk 256: 16 such gaps; the
512 run, at load 0.8: none). The delay is a property of the moment (the front end's share of the
CPU), not of the request or the step's shape, so it is kept as a time series - per step, the median
delay of the tokens it produced - and a replayed token made at time t is delayed by the series at
t (seed 0) or at t plus a seeded circular shift (the other replicates: the same delays at other
moments of the traffic). Per-token residuals drawn independently would break a burst (a long gap
is followed by near-zero ones) and add spread in both directions.

Stalls are not carried over. A step whose tokens were still held when the engine had finished
:data:`STALL_STEPS` more steps is a front-end stall (the API server not scheduled, not keeping up):
on the testbed those are episodes of the host, not of the setting or the traffic - the two runs of
identical traffic at 512 tokens had 0 and 10 of them (0.25-1.2 s each), the 256 run 16, so the
input's stalls say nothing about when or whether the next run stalls. The replay adds the delay of
a front end that keeps up (a stalled step counts at the median delay) and the stalls are reported
(``stalls``, ``stalled_s``): P99 ITL of a run that stalls like the input did is higher by about them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: at least this share of the client's requests must be placed on the steps, and their median
#: delay must be below MAX_MEDIAN_LAG_S, else the clocks are not one (a client on another host, a
#: log without unix stamps) and no delay is modelled. Basis: on the testbed, every request of a
#: run is placed and the median delay is 1.4-6.3 ms (5 runs at 256-2048-token budgets).
MIN_JOINED_SHARE = 0.5
MAX_MEDIAN_LAG_S = 0.25
#: a step whose tokens reach the client only after the engine finished this many more steps is a
#: stall of the front end. Basis: a front end that keeps up delivers a step's tokens within about a
#: step (testbed, 512-token run at load 0.8: per-step delay P50 1.5 ms, P90 ~6 ms, decode steps
#: 7-12 ms); a stall holds tokens over 10-100 steps (0.1-1.4 s). Margin: 3 steps, not 2, so that one
#: long step's output handling is not called a stall.
STALL_STEPS = 3


@dataclass(frozen=True)
class FrontEndDelay:
    """Per engine step with tokens: its time relative to the workload's first arrival and the
    median delay of its tokens at the client."""

    t_s: np.ndarray
    lag_s: np.ndarray
    tokens: int                  # tokens placed on a step
    requests: int                # requests placed
    stalls: int = 0              # front-end stalls in the input (episodes of STALL_STEPS+ held steps)
    stalled_s: float = 0.0       # their time in all (not carried into lag_s)

    def sampler(self, seed: int = 0):
        """``f(t)``: the delay of a token produced at replay time ``t`` (seconds from the first arrival)."""
        span = float(self.t_s[-1] - self.t_s[0]) if len(self.t_s) > 1 else 0.0
        shift = 0.0 if seed == 0 or span <= 0 else float(np.random.default_rng(seed).uniform(0.0, span))
        t0, ts, lag = float(self.t_s[0]), self.t_s, self.lag_s

        def at(t: float) -> float:
            x = t + shift
            if span > 0:
                x = t0 + (x - t0) % span
            i = int(np.searchsorted(ts, x, side="right")) - 1
            return float(lag[max(i, 0)])
        return at

    def describe(self) -> dict:
        q = (lambda p: float(np.quantile(self.lag_s, p)))
        return {"steps": int(len(self.t_s)), "tokens": self.tokens, "requests": self.requests,
                "lag_p50_s": q(0.5), "lag_p99_s": q(0.99), "lag_max_s": float(self.lag_s.max()),
                "stalls": self.stalls, "stalled_s": self.stalled_s}


def measure(tokens: pd.DataFrame | None, stamps, t0: float) -> FrontEndDelay | None:
    """The front-end delay of the client ``tokens`` (a Timeline ``tokens`` frame: request_id, t_s,
    n_tokens) over the engine steps stamped at ``stamps`` (seconds, same clock); ``t0``: the
    workload's first arrival. None when too few requests can be placed (see MIN_JOINED_SHARE)."""
    if tokens is None or not len(tokens):
        return None
    st = np.sort(np.asarray(stamps, dtype=float))
    if len(st) < 2:
        return None
    steps, lags = [], []
    ok = total = 0
    for _, g in tokens.sort_values("t_s", kind="stable").groupby("request_id", sort=False):
        total += 1
        t = g["t_s"].to_numpy(dtype=float)
        n = g["n_tokens"].fillna(1).clip(lower=1).to_numpy(dtype=int) if "n_tokens" in g else np.ones(len(t), int)
        at = np.searchsorted(st, t, side="right") - 1
        idx = at.copy()
        for j in range(len(t) - 2, -1, -1):        # the latest steps in order: each event after the last
            idx[j] = min(at[j], idx[j + 1] - n[j + 1])
        if idx[0] - (n[0] - 1) < 0:
            continue
        steps.append(idx)
        lags.append(t - st[idx])
        ok += 1
    if not total or ok < MIN_JOINED_SHARE * total:
        return None
    idx, lag = np.concatenate(steps), np.concatenate(lags)
    if float(np.median(lag)) > MAX_MEDIAN_LAG_S:
        return None
    per = pd.Series(lag).groupby(idx).median()
    at, dl = per.index.to_numpy(), per.to_numpy()
    held = np.searchsorted(st, st[at] + dl, side="right") - at - 1     # steps the engine finished meanwhile
    stalled = held >= STALL_STEPS
    steady = np.where(stalled, float(np.median(dl[~stalled])) if (~stalled).any() else 0.0, dl)
    return FrontEndDelay(st[at] - t0, steady, int(len(lag)), ok, stalls=_episodes(stalled),
                         stalled_s=float(_stalled_time(st[at], dl, stalled)))


def _episodes(flags: np.ndarray) -> int:
    """Runs of consecutive True."""
    f = flags.astype(int)
    return int(((np.diff(np.concatenate([[0], f])) == 1)).sum())


def _stalled_time(t: np.ndarray, lag: np.ndarray, stalled: np.ndarray) -> float:
    """Seconds the front end held tokens back in stalls: per episode, from its first held step to
    the release (that step's time + its delay)."""
    total, start, release = 0.0, None, 0.0
    for ti, li, s in zip(t, lag, stalled):
        if s:
            start = ti if start is None else start
            release = max(release, ti + li)
        elif start is not None:
            total += release - start
            start, release = None, 0.0
    return total + (release - start if start is not None else 0.0)
