"""The Triton flat-stream paged attention matches the PyTorch reference under TRITON_INTERPRET=1.

``triton.jit`` (and triton.language's own jit helpers) choose interpreter or compiler when they are
imported, and other tests import triton normally first; so the kernel runs in a child process
started with TRITON_INTERPRET=1 (one per session, :func:`results`), which evaluates every case
below and reports errors that the tests here check.
"""
import json
import math
import os
import subprocess
import sys
import zlib

import pytest
import torch


def naive_reference(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale):
    """One request at a time: gather its KV through the block table, causal softmax, GQA repeat."""
    T, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    for b in range(seq_lens.shape[0]):
        s, e = int(query_start_loc[b]), int(query_start_loc[b + 1])
        n = int(seq_lens[b])
        pos = torch.arange(n)
        blocks = block_tables[b, pos // block_size].long()
        k = k_cache[blocks, pos % block_size].repeat_interleave(Hq // Hkv, dim=1)  # [n, Hq, D]
        v = v_cache[blocks, pos % block_size].repeat_interleave(Hq // Hkv, dim=1)
        qpos = torch.arange(n - (e - s), n)
        scores = torch.einsum("thd,nhd->htn", q[s:e].double(), k.double()) * scale
        scores = scores.masked_fill(pos[None, None, :] > qpos[None, :, None], float("-inf"))
        out[s:e] = torch.einsum("htn,nhd->thd", scores.softmax(-1), v.double()).to(q.dtype)
    return out


def make_case(gen, q_lens, ctx_lens, hq, hkv, d, block_size, dtype=torch.float32):
    """Random cache with requests' blocks scattered (shuffled physical ids, block_tables padded)."""
    seq_lens = [c + ql for c, ql in zip(ctx_lens, q_lens)]
    need = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(need) + 1
    tables = torch.full((len(q_lens), max_blocks), num_blocks - 1, dtype=torch.int32)  # padding entries
    used = 0
    for b, nb in enumerate(need):
        tables[b, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen).to(dtype)
    T = sum(q_lens)
    q = torch.randn(T, hq, d, generator=gen).to(dtype)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    return q, k_cache, v_cache, qsl, torch.tensor(seq_lens, dtype=torch.int32), tables


CASES = [
    # name,              q_lens,        ctx_lens,     Hq, Hkv, D,  block_size
    ("decode-only",      [1, 1, 1],     [5, 16, 33],  4,  2,   16, 16),
    ("prefill-only",     [7, 20],       [0, 0],       2,  2,   16, 16),
    ("mixed",            [19, 1, 1, 3], [0, 40, 3, 9], 4, 1,   32, 8),
    ("chunk-continues",  [9],           [23],         8,  2,   16, 4),
    ("block-boundary",   [16, 1],       [16, 31],     2,  1,   16, 16),
    ("gqa-3-odd-dim",    [5, 1],        [2, 12],      6,  2,   24, 5),
    ("mha-big-group",    [1, 4],        [60, 0],      32, 1,   16, 16),
]


TOL = dict(atol=2e-5, rtol=2e-5)


def _compare(got, want) -> dict:
    return {"max_abs_err": float((got - want).abs().max()), "close": bool(torch.allclose(got, want, **TOL))}


def random_cases(n=6, seed=1234):
    """Varlen mixes of decode rows and prefill chunks across GQA ratios and block sizes."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for trial in range(n):
        hkv = int(torch.randint(1, 3, (1,), generator=gen))
        group = [1, 2, 4][int(torch.randint(0, 3, (1,), generator=gen))]
        block_size = [4, 8, 16][int(torch.randint(0, 3, (1,), generator=gen))]
        b = int(torch.randint(1, 5, (1,), generator=gen))
        q_lens = [1 if torch.rand(1, generator=gen) < 0.5 else int(torch.randint(2, 24, (1,), generator=gen))
                  for _ in range(b)]
        ctx_lens = [int(torch.randint(0, 40, (1,), generator=gen)) for _ in range(b)]
        out.append((f"random-{trial}", q_lens, ctx_lens, hkv * group, hkv, 16, block_size))
    return out


def run_all() -> dict:
    """Child process (TRITON_INTERPRET=1 from the start): every case through the kernel."""
    from mixdiag.engine.model.attention import paged_attention_ref
    from mixdiag.engine.model.triton_attention import paged_attention

    res = {}
    for name, q_lens, ctx_lens, hq, hkv, d, block_size in CASES + random_cases():
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        args = make_case(gen, q_lens, ctx_lens, hq, hkv, d, block_size)
        scale = 1 / math.sqrt(d)
        got, want = paged_attention(*args, scale), paged_attention_ref(*args, scale)
        res[name] = {"kernel_vs_ref": _compare(got, want), "ref_vs_naive": _compare(want, naive_reference(*args, scale)),
                     "shapes": [q_lens, ctx_lens]}
    q, k, v, qsl, sl, bt = make_case(torch.Generator().manual_seed(0), [1], [3], 3, 2, 16, 4)
    try:
        paged_attention(q, k, v, qsl, sl, bt, 1.0)
        res["bad-head-ratio"] = "accepted"
    except ValueError as e:
        res["bad-head-ratio"] = str(e)
    return res


@pytest.fixture(scope="module")
def results():
    code = ("import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('t', sys.argv[1]); "
            "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t); print(json.dumps(t.run_all()))")
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [c[0] for c in CASES] + [c[0] for c in random_cases()])
def test_kernel_matches_reference(results, name):
    r = results[name]
    assert r["kernel_vs_ref"]["close"], (name, r)
    # the engine's reference itself agrees with the one-request-at-a-time oracle
    assert r["ref_vs_naive"]["close"], (name, r)


def test_rejects_bad_head_ratio(results):
    assert "multiple" in results["bad-head-ratio"]


ENGINE_SCRIPT = r"""
import json, sys
from mixdiag.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.model.attention import paged_attention_ref
from mixdiag.engine.core.request import SamplingParams
cfg = ModelConfig(vocab_size=29, hidden_size=16, num_layers=2, first_k_dense=1, num_heads=4, num_kv_heads=2,
                  head_dim=16, intermediate_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                  max_model_len=64)
outs = {}
for name in ("engine-backend", "reference"):
    e = Engine(EngineConfig(model=cfg, cache=CacheConfig(block_size=4, num_blocks=64),
                            scheduler=SchedulerConfig(max_num_batched_tokens=16, num_spec_tokens=2), num_threads=1))
    if name == "reference":
        e.model.attn_backend = paged_attention_ref
    backend = e.model.attn_backend.__name__
    ids = [e.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True)) for p in ([3, 4, 5, 6, 7, 8, 9], [2, 2, 2, 2, 3])]
    e.run()
    outs[name] = {"backend": backend, "outputs": [e.output(i) for i in ids]}
print(json.dumps(outs))
"""


def test_engine_uses_the_kernel_under_the_interpreter_with_the_same_outputs():
    """TRITON_INTERPRET=1 makes the engine pick the Triton kernel on CPU; greedy outputs (mixed
    prefill/decode steps with spec verification rows) equal the PyTorch reference's."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    outs = json.loads(res.stdout.strip().splitlines()[-1])
    assert outs["engine-backend"]["backend"] == "paged_attention"
    assert outs["reference"]["backend"] == "paged_attention_ref"
    assert outs["engine-backend"]["outputs"] == outs["reference"]["outputs"]
