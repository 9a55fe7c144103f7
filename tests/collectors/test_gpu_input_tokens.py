"""Token allocation of an engine that keeps its inputs on the GPU (SGLang: ``prepare_for_decode`` reuses
the output ids; ``prepare_for_extend`` uploads only a new prompt's tensors), when prompts ride on most steps.

Basis: python/sglang/srt/managers/schedule_batch.py (decode inputs stay on the device, an extend batch
copies the prompt's ids/seq_lens/req_pool_indices with ``.to(device, non_blocking=True)``); with DP
attention the rank holding a long chunked prompt uploads on every step of the prompt, and its running
decodes ride along in the same extend (mixed) batch. Per step, the rows ``collectors/traces/steps``
builds: H2D bytes and copies, the D2H sampled-id bytes (8 per sampled request), attention families.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.traces.steps.token_inference import infer_tokens

N = 200


def _steps(reqs: np.ndarray, prompt: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"h2d_bytes": np.where(prompt, 8 * 2000 + 16 * reqs, 0),
                         "d2h_bytes": 8 * reqs, "h2d_copies": np.where(prompt, 3, 0),
                         "prefill_family": prompt, "decode_family": ~prompt})


def _walk(lo: int, hi: int, start: int, seed: int, drift: bool = True) -> np.ndarray:
    """A running batch that drifts a few requests a step (requests join and finish), or holds near ``start``."""
    rng = np.random.default_rng(seed)
    step = rng.integers(-2, 3, hi - lo)
    return np.clip(start + (np.cumsum(step) if drift else step), 4, None)


def _prompt_on_most_steps():
    reqs = _walk(0, N, 40, 1)
    prompt = np.zeros(N, bool)
    prompt[40:170] = True          # 65 % of the steps upload a prompt chunk
    reqs = reqs + prompt           # the chunked prompt samples too (one more request)
    return reqs, prompt, np.where(prompt, "mixed", "decode")


def _batch_drained_under_the_prompt():
    reqs = np.concatenate([_walk(0, 40, 190, 2, drift=False), _walk(40, N, 11, 3, drift=False)])
    prompt = np.zeros(N, bool)
    prompt[38:150] = True          # an oversized batch drained while a prompt rode along
    reqs = reqs + prompt
    return reqs, prompt, np.where(prompt, "mixed", "decode")


def _prefill_only_steps():
    reqs = _walk(0, N, 30, 4)
    prompt = np.zeros(N, bool)
    prompt[[50, 51, 120]] = True   # extend batches of one new prompt, no decode rows
    reqs = np.where(prompt, 1, reqs)
    return reqs, prompt, np.where(prompt, "prefill", "decode")


CASES = {"prompt-on-most-steps": _prompt_on_most_steps, "batch-drained-under-the-prompt": _batch_drained_under_the_prompt,
         "prefill-only-steps": _prefill_only_steps}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_input_kinds(name):
    reqs, prompt, want = CASES[name]()
    s = _steps(reqs.astype(np.int64), prompt)
    out = infer_tokens(s, np.zeros(0, int), np.zeros(0, int), np.zeros(0))
    got = out["kind"].to_numpy()
    bad = np.flatnonzero(got != want)
    assert not len(bad), (name, [(int(i), got[i], want[i]) for i in bad[:5]])
    # prompt tokens of a GPU-input engine are not in the trace (element size unknown): NaN, never planned
    assert out.loc[prompt, "prefill_tokens"].isna().all() and (out.loc[~prompt, "prefill_tokens"] == 0).all()
