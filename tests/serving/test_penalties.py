"""Presence and frequency penalties (OpenAI semantics) in the sampler and over HTTP."""
from __future__ import annotations

import httpx
import pytest
import torch

from mixdiag.engine.core.request import InvalidRequest, Request, SamplingParams
from mixdiag.engine.core.sampler import penalize, sample

MODEL = "mixdiag-tiny"


def _req(generated, **params) -> Request:
    r = Request("r", [1, 2], SamplingParams(max_tokens=50, **params), arrival_s=0.0)
    r.output_token_ids.extend(generated)
    return r


def test_penalize_subtracts_presence_once_and_frequency_per_count():
    row = torch.tensor([0.0, 3.0, 2.5, 1.0])
    got = penalize(row, [1, 1, 3], presence=0.5, frequency=0.25)
    assert got.tolist() == pytest.approx([0.0, 3.0 - 0.5 - 0.5, 2.5, 1.0 - 0.5 - 0.25])


@pytest.mark.parametrize("generated, params, want", [
    ([1], {}, 1),                                        # no penalty: the top logit
    ([1], {"presence_penalty": 0.4}, 1),                 # 3.0 - 0.4 still beats 2.5
    ([1], {"presence_penalty": 1.0}, 2),                 # 3.0 - 1.0 < 2.5
    ([1], {"frequency_penalty": 0.3}, 1),                # one occurrence: 2.7
    ([1, 1], {"frequency_penalty": 0.3}, 2),             # two: 2.4
    ([1, 1], {"presence_penalty": 0.3}, 1),              # presence does not grow with the count
    ([2], {"presence_penalty": -2.0}, 2),                # a negative penalty favours what was said
    ([], {"presence_penalty": 2.0}, 1),                  # nothing generated yet: nothing to penalise
])
def test_greedy_choice_follows_the_penalties(generated, params, want):
    logits = torch.tensor([[0.0, 3.0, 2.5, 1.0]])
    assert sample(logits, [_req(generated, **params)]) == [want]


def test_sampled_rows_apply_the_penalties_before_the_softmax():
    def draws(row, generated, **params):
        logits = torch.tensor([row])
        return {sample(logits, [_req(generated, temperature=0.5, seed=s, **params)])[0] for s in range(20)}

    assert draws([0.0, 3.0, 1.0, 1.0], [1] * 5) == {1}                            # e^6 against e^2
    assert 1 not in draws([0.0, 3.0, 1.0, 1.0], [1] * 5, frequency_penalty=2.0)   # 3 - 10
    assert draws([0.0, 30.0, 1.0, 1.0], [1], presence_penalty=2.0) == {1}         # lowered, not forbidden


@pytest.mark.parametrize("key, value", [("presence_penalty", 2.5), ("frequency_penalty", -3), ("presence_penalty", "1")])
def test_out_of_range_penalties_are_invalid(key, value):
    with pytest.raises(InvalidRequest, match=key):
        SamplingParams(**{key: value})


def _text(server, **extra) -> str:
    body = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 100, "temperature": 0, "ignore_eos": True, **extra}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_penalties_change_the_served_output_only_when_nonzero(server):
    plain = _text(server)
    assert _text(server, presence_penalty=0, frequency_penalty=0.0) == plain
    assert _text(server, presence_penalty=None, frequency_penalty=None) == plain
    # the tiny random model repeats tokens within 100 greedy ones; a penalty steers away from them
    assert _text(server, presence_penalty=2.0) != plain
    assert _text(server, frequency_penalty=2.0) != plain
    assert _text(server, frequency_penalty=-2.0) != plain


@pytest.mark.parametrize("key", ["presence_penalty", "frequency_penalty"])
def test_out_of_range_penalty_gets_openai_400(server, key):
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", key: 2.5}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == key


def test_penalties_are_refused_where_speculative_decoding_would_ignore_them(server):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "presence_penalty": 1.0}
    server.state.spec_decode = True   # as a scenario with num_spec_tokens > 0 sets it
    try:
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=10)
        plain = httpx.post(server.url + "/v1/completions", json={**body, "presence_penalty": 0}, timeout=30)
    finally:
        server.state.spec_decode = False
    assert r.status_code == 400 and "speculative" in r.json()["error"]["message"]
    assert plain.status_code == 200
