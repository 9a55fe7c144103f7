"""Workload generation: arrivals, lengths, shared prefixes, determinism."""
import numpy as np
import pytest

from mixdiag.engine.config import ConfigError
from mixdiag.engine.testbed.workload import LengthDist, RequestGroup, Workload, generate


def gen(*groups, seed=0, unit="step"):
    return generate(Workload(groups=tuple(groups), time_unit=unit), seed, vocab_size=100, max_model_len=512)


@pytest.mark.parametrize("arrival,start,interval,want", [
    ("burst", 3, 9, [3, 3, 3, 3]),
    ("fixed", 2, 5, [2, 7, 12, 17]),
])
def test_deterministic_arrivals(arrival, start, interval, want):
    items = gen(RequestGroup(count=4, arrival=arrival, start=start, interval=interval))
    assert [it.arrival for it in items] == want


def test_poisson_arrivals_mean_gap():
    items = gen(RequestGroup(count=2001, arrival="poisson", start=5, interval=4.0))
    gaps = np.diff([it.arrival for it in items])
    assert items[0].arrival == 5 and (gaps >= 0).all()
    assert abs(gaps.mean() - 4.0) < 0.3


@pytest.mark.parametrize("dist,check", [
    (LengthDist("fixed", value=17), lambda x: set(x) == {17}),
    (LengthDist("uniform", low=5, high=9), lambda x: min(x) == 5 and max(x) == 9),
    (LengthDist("lognormal", low=4, high=60, median=20, sigma=0.5), lambda x: min(x) >= 4 and max(x) <= 60
     and 15 <= np.median(x) <= 25),
])
def test_length_dists(dist, check):
    x = dist.sample(np.random.default_rng(0), 500)
    assert check(x.tolist())


def test_prompts_outputs_prefix_and_seed():
    g = RequestGroup(name="sys", count=5, prompt_len=LengthDist("uniform", low=20, high=40),
                     output_len=LengthDist(value=7), shared_prefix_len=12)
    a, b, c = gen(g, seed=1), gen(g, seed=1), gen(g, seed=2)
    assert [x.prompt for x in a] == [x.prompt for x in b] and [x.prompt for x in a] != [x.prompt for x in c]
    assert len({tuple(x.prompt[:12]) for x in a}) == 1 and len({tuple(x.prompt[12:]) for x in a}) == 5
    assert all(20 <= len(x.prompt) <= 40 and x.params.max_tokens == 7 and x.params.ignore_eos for x in a)
    assert [x.request_id for x in a] == [f"sys-{i}" for i in range(5)]


def test_lengths_capped_by_max_model_len():
    items = gen(RequestGroup(count=3, prompt_len=LengthDist(value=600), output_len=LengthDist(value=100)))
    assert all(len(it.prompt) == 511 and it.params.max_tokens == 1 for it in items)


def test_groups_interleave_by_arrival():
    items = gen(RequestGroup(name="a", count=3, arrival="fixed", start=0, interval=10),
                RequestGroup(name="b", count=2, arrival="fixed", start=5, interval=10))
    assert [it.request_id for it in items] == ["a-0", "b-0", "a-1", "b-1", "a-2"]


@pytest.mark.parametrize("make,match", [
    (lambda: LengthDist("zipf"), "length dist"),
    (lambda: LengthDist("uniform", low=9, high=3), "low <= high"),
    (lambda: RequestGroup(arrival="gamma"), "arrival"),
    (lambda: RequestGroup(temperature=-1), "temperature"),
    (lambda: Workload(time_unit="ms"), "time_unit"),
])
def test_invalid(make, match):
    with pytest.raises(ConfigError, match=match):
        make()
