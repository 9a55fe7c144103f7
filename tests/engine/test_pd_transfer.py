"""PD transfer: a real prefill worker process ships prompt KV over a 127.0.0.1 socket."""
import time

import pytest
import torch

from mixdiag.engine.config import ModelConfig
from mixdiag.engine.model.model import build_model
from mixdiag.engine.testbed.pd_transfer import (PDConfig, PDTransfer, compute_prompt_kv, expected_transfer_bytes, install_kv,
                                        kv_nbytes)

CFG = ModelConfig(hidden_size=32, num_layers=3, first_k_dense=1, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=48, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                  vocab_size=64, max_model_len=256, seed=3)


def _prompt(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, CFG.vocab_size, (n,), generator=g).tolist()


@pytest.mark.parametrize("kw, msg", [
    ({"mode": "async"}, "mode"), ({"link_bytes_per_s": -1}, "link_bytes_per_s"),
    ({"prefill_chunk_tokens": 0}, "prefill_chunk_tokens"), ({"worker_threads": 0}, "worker_threads"),
])
def test_config_rejects_bad_values(kw, msg):
    with pytest.raises(ValueError, match=msg):
        PDConfig(**kw)


def test_chunked_prompt_kv_matches_one_pass():
    model = build_model(CFG)
    ids = _prompt(37)
    whole = compute_prompt_kv(model, ids, chunk_tokens=64, block_size=8)
    assert whole.shape == (3, 2, 37, 2, 8)
    assert whole.numel() * whole.element_size() == kv_nbytes(CFG, 37)
    torch.testing.assert_close(compute_prompt_kv(model, ids, chunk_tokens=5, block_size=4), whole,
                               rtol=1e-5, atol=1e-5)
    # KV of a prefix does not depend on what follows (causal)
    torch.testing.assert_close(compute_prompt_kv(model, ids[:20], chunk_tokens=64)[:, :, :20], whole[:, :, :20],
                               rtol=1e-5, atol=1e-5)


def test_install_kv_places_positions_by_block_table():
    pool = torch.zeros(2, 2, 6, 4, 1, 3)
    kv = torch.arange(2 * 2 * 7 * 1 * 3, dtype=torch.float32).view(2, 2, 7, 1, 3)
    install_kv(pool, [4, 1], kv)
    torch.testing.assert_close(pool[:, :, 4], kv[:, :, :4])
    torch.testing.assert_close(pool[:, :, 1, :3], kv[:, :, 4:])
    assert float(pool[:, :, [0, 2, 3, 5]].abs().sum()) == 0 and float(pool[:, :, 1, 3].abs().sum()) == 0
    with pytest.raises(ValueError, match="cannot hold"):
        install_kv(pool, [0], kv)


@pytest.mark.parametrize("mode", ["sync", "overlap"])
def test_worker_ships_exact_prompt_kv(mode):
    model = build_model(CFG)
    prompts = {"a": _prompt(50, 1), "b": _prompt(9, 2), "c": _prompt(2, 3)}
    with PDTransfer(CFG, PDConfig(mode=mode, prefill_chunk_tokens=16)) as pd:
        for rid, p in prompts.items():
            assert pd.submit(rid, p) == len(p) - 1
        got = {}
        deadline = time.monotonic() + 60
        while pd.pending and time.monotonic() < deadline:
            for r in pd.poll(wait=True, timeout_s=5):
                got[r.request_id] = r
        assert set(got) == set(prompts) and not pd.pending
        with pytest.raises(ValueError, match="at least 2"):
            pd.submit("d", [5])
    for rid, p in prompts.items():
        r = got[rid]
        assert r.nbytes == kv_nbytes(CFG, len(p) - 1) and r.transfer_s >= 0 and r.prefill_s > 0
        torch.testing.assert_close(r.kv, compute_prompt_kv(model, p[:-1], 16), rtol=1e-5, atol=1e-5)
    assert sum(r.nbytes for r in got.values()) == expected_transfer_bytes(CFG, [len(p) for p in prompts.values()])


def test_paced_link_takes_bytes_over_bandwidth():
    p = _prompt(200, 4)
    nbytes = kv_nbytes(CFG, 199)  # 199 tokens * 2*3*2*8*4 B = 76416 B
    rate = nbytes / 0.3  # a link that needs 0.3 s for this prompt
    with PDTransfer(CFG, PDConfig(mode="sync", link_bytes_per_s=rate)) as pd:
        pd.submit("r", p)
        (r,) = pd.poll(wait=True, timeout_s=60)
    # the receiver starts reading at the header, sent just before the first chunk
    assert r.nbytes == nbytes and r.transfer_s >= 0.2
