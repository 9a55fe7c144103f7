"""The periodicity test's binomial tail (signals._binom_sf) in log space: exact against rational
arithmetic, and no overflow once a capture holds more than ~1000 spikes (issue 22)."""
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from mixdiag.cli import main
from mixdiag.diagnosis.detection.signals import _binom_sf


def _exact_sf(k: int, n: int, p: str) -> float:
    """The tail in integers: p = a/b, sum of comb(n, i) a^i (b - a)^(n - i) over b^n."""
    q = Fraction(p)
    a, b = q.numerator, q.denominator
    return float(Fraction(sum(math.comb(n, i) * a ** i * (b - a) ** (n - i) for i in range(max(k, 0), n + 1)), b ** n))


@pytest.mark.parametrize("k, n, p", [(1, 1, "0.5"), (3, 10, "0.3"), (5, 5, "0.2"), (50, 100, "0.3"), (10, 200, "0.01"),
                                     (1, 1000, "1e-5"), (400, 1000, "0.33"), (700, 1500, "0.45")])
def test_tail_equals_the_exact_sum(k, n, p):
    assert _binom_sf(k, n, float(p)) == pytest.approx(_exact_sf(k, n, p), rel=1e-10)


def test_tail_edges_and_large_n():
    assert _binom_sf(0, 10, 0.3) == 1.0 and _binom_sf(11, 10, 0.3) == 0.0
    assert _binom_sf(3, 10, 0.0) == 0.0 and _binom_sf(3, 10, 1.0) == 1.0
    # 10^5 spikes: the median of Binomial(n, 1/2) has a tail just over 1/2, far above it ~0
    assert _binom_sf(50_000, 100_000, 0.5) == pytest.approx(0.5 + 0.5 * _exact_pmf_half(100_000), rel=1e-9)
    assert 0.0 <= _binom_sf(60_000, 100_000, 0.5) < 1e-300


def _exact_pmf_half(n: int) -> float:
    """P(X = n/2) for X ~ Binomial(n, 1/2), from lgamma (a closed form, not the code under test)."""
    return math.exp(math.lgamma(n + 1) - 2 * math.lgamma(n / 2 + 1) - n * math.log(2))


def _client_capture(path, seconds: float = 180.0, t0: float = 1.76e9) -> None:
    """A `mixdiag load` file: 20 ms decode steps; every 5th step a new prompt joins (a 60 ms mixed
    step), every 7th a 60 ms stall without arrivals - so about 70 % of spikes fall near arrivals,
    the share where the old sum of comb(n, i) p^i overflowed."""
    rng = np.random.default_rng(0)
    t, j, reqs, live = t0, 0, {}, []
    while t < t0 + seconds:
        mixed = j % 5 == 0
        dt = (0.06 if mixed or j % 7 == 3 else 0.02) + float(rng.uniform(0, 0.002))
        t += dt
        if mixed:
            rid = f"r{len(reqs)}"
            reqs[rid] = {"type": "request", "request_id": rid, "start_s": t - dt - 0.01, "prompt_tokens": 512,
                         "status": "ok", "token_times_s": []}
            live.append([rid, 40])
        for r in live:
            reqs[r[0]]["token_times_s"].append(round(t + float(rng.uniform(0, 3e-4)), 6))
            r[1] -= 1
        live = [r for r in live if r[1] > 0]
        j += 1
    path.write_text("\n".join(json.dumps(x) for x in [{"format": "mixdiag-load"}, *reqs.values()]) + "\n")


def test_a_three_minute_client_capture_with_over_1000_spikes_is_diagnosed(tmp_path, capsys):
    # Regression: `mixdiag analyze client.jsonl` -> "OverflowError: int too large to convert to float"
    path = tmp_path / "client.jsonl"
    _client_capture(path)
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    n = sum(doc["by_cause"].values())
    assert n > 1000 and doc["by_cause"].get("mixing", 0) > 1000
