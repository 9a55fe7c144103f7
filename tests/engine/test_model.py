"""The decoder: deterministic weights, chunking invariance, MoE routing, tracer ranges, checkpoints."""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from mixdiag.engine.model.checkpoint import load_checkpoint
from mixdiag.engine.config import CacheConfig, ModelConfig
from mixdiag.engine.hooks import RecordingTracer
from mixdiag.engine.core.input_batch import ForwardBatch
from mixdiag.engine.core.kv_cache import allocate_kv_cache
from mixdiag.engine.model.model import build_model
from mixdiag.errors import UserError

CFG = ModelConfig(vocab_size=97, hidden_size=32, num_layers=3, first_k_dense=1, num_heads=4, num_kv_heads=2,
                  head_dim=8, intermediate_size=48, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                  shared_expert_intermediate_size=16, max_model_len=128, dtype="float64")


def batch_for(chunks, block_size=4):
    """A ForwardBatch for one request per (start, tokens) chunk; request b owns blocks b*16.. ."""
    ids, pos, slots, qsl, sl, last = [], [], [], [0], [], []
    for b, (start, toks) in enumerate(chunks):
        for i, t in enumerate(toks):
            p = start + i
            ids.append(t)
            pos.append(p)
            slots.append((b * 16 + p // block_size) * block_size + p % block_size)
        qsl.append(qsl[-1] + len(toks))
        sl.append(start + len(toks))
        last.append(qsl[-1] - 1)
    bt = torch.tensor([[b * 16 + j for j in range(16)] for b in range(len(chunks))], dtype=torch.int32)
    L = torch.long
    return ForwardBatch(torch.tensor(ids, dtype=L), torch.tensor(pos, dtype=L), torch.tensor(qsl, dtype=torch.int32),
                        torch.tensor(sl, dtype=torch.int32), torch.tensor(slots, dtype=L), bt, torch.tensor(last, dtype=L),
                        tuple(map(str, range(len(chunks)))), tuple(map(str, range(len(chunks)))))


def kv(cfg=CFG, blocks=64):
    return allocate_kv_cache(cfg, CacheConfig(block_size=4, num_blocks=blocks))


def test_weights_deterministic_from_seed():
    a, b, c = build_model(CFG), build_model(CFG), build_model(CFG.replace(seed=1))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["lm_head.weight"], sc["lm_head.weight"])


def test_chunked_prefill_and_decode_match_one_shot():
    m = build_model(CFG)
    toks = torch.randint(0, CFG.vocab_size, (11,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode():
        full = m(batch_for([(0, toks)]), kv())[0]
        cache = kv()
        m(batch_for([(0, toks[:4])]), cache)
        m(batch_for([(4, toks[4:10])]), cache)
        step = m(batch_for([(10, toks[10:])]), cache)[0]
    torch.testing.assert_close(step, full, rtol=1e-10, atol=1e-10)


def test_request_logits_independent_of_batch_mates():
    m = build_model(CFG)
    a, b = [5, 6, 7, 8, 9], [1, 2, 3]
    with torch.inference_mode():
        alone = m(batch_for([(0, a)]), kv())[0]
        together = m(batch_for([(0, b), (0, a)]), kv())[1]
    torch.testing.assert_close(together, alone, rtol=1e-10, atol=1e-10)


def test_local_experts_match_per_token_loop():
    moe = build_model(CFG).moe_layers[0]
    x = torch.randn(7, CFG.hidden_size, dtype=torch.float64)
    ids, w = moe.route(x)
    got = moe.local_experts(x, ids, w)
    want = torch.stack([sum(w[t, j] * moe.expert(int(ids[t, j]), x[t:t + 1])[0] for j in range(ids.shape[1]))
                        for t in range(7)])
    torch.testing.assert_close(got, want)
    assert torch.allclose(w.sum(-1), torch.ones(7, dtype=torch.float64))


def test_router_bias_and_experts_impl_seam():
    m = build_model(CFG)
    moe = m.moe_layers[0]
    x = torch.randn(16, CFG.hidden_size, dtype=torch.float64)
    moe.router_bias[2] = 1e3                       # a fault skews routing: every token picks expert 2
    ids, _ = moe.route(x)
    assert (ids == 2).any(dim=-1).all()
    seen = []
    moe.experts_impl = lambda x, i, w: seen.append(i.shape) or torch.zeros_like(x)
    moe(x)
    assert seen == [(16, CFG.num_experts_per_tok)]


def test_tracer_ranges_per_layer():
    m = build_model(CFG)
    m.tracer = tr = RecordingTracer()
    with torch.inference_mode():
        m(batch_for([(0, [1, 2])]), kv())
    assert [msg for _, msg, _ in tr.ranges] == ["attn L0", "attn L1", "moe L1", "attn L2", "moe L2"]


def test_attn_backend_is_called():
    m = build_model(CFG)
    calls = []
    ref = m.attn_backend
    m.attn_backend = lambda *a: calls.append(a[3].tolist()) or ref(*a)
    with torch.inference_mode():
        m(batch_for([(0, [1, 2, 3]), (0, [4])]), kv())
    assert calls == [[0, 3, 4]] * CFG.num_layers


# ---- checkpoints ---------------------------------------------------------------------------
HF = {"model_type": "qwen2", "vocab_size": 61, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 24, "max_position_embeddings": 64, "rope_theta": 1000.0,
      "rms_norm_eps": 1e-6, "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "float32"}


def write_checkpoint(d, hf=HF, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, i, v, hd = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"], hf["hidden_size"] // hf["num_attention_heads"]
    nq, nkv = hf["num_attention_heads"] * hd, hf["num_key_value_heads"] * hd
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    t = {"model.embed_tokens.weight": r(v, h), "model.norm.weight": 1 + r(h), "lm_head.weight": r(v, h)}
    for L in range(hf["num_hidden_layers"]):
        p = f"model.layers.{L}."
        t.update({p + "input_layernorm.weight": 1 + r(h), p + "post_attention_layernorm.weight": 1 + r(h),
                  p + "self_attn.q_proj.weight": r(nq, h), p + "self_attn.k_proj.weight": r(nkv, h),
                  p + "self_attn.v_proj.weight": r(nkv, h), p + "self_attn.o_proj.weight": r(h, nq),
                  p + "self_attn.q_proj.bias": r(nq), p + "self_attn.k_proj.bias": r(nkv),
                  p + "self_attn.v_proj.bias": r(nkv),
                  p + "mlp.gate_proj.weight": r(i, h), p + "mlp.up_proj.weight": r(i, h), p + "mlp.down_proj.weight": r(h, i)})
    (d / "config.json").write_text(json.dumps(hf))
    save_file(t, str(d / "model.safetensors"))
    return t


def hf_reference_logits(t, hf, toks):
    """Plain full-sequence Qwen2 forward written from the HF definition (rotate_half RoPE, causal SDPA)."""
    h, nh, nkv = hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"]
    hd, n = h // nh, len(toks)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + hf["rms_norm_eps"]) * w

    inv = 1.0 / (hf["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().float(), emb.sin().float()

    def rope(x):  # [heads, n, hd]
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = t["model.embed_tokens.weight"][toks]
    for L in range(hf["num_hidden_layers"]):
        p = f"model.layers.{L}."
        y = rms(x, t[p + "input_layernorm.weight"])
        q = (y @ t[p + "self_attn.q_proj.weight"].T + t[p + "self_attn.q_proj.bias"]).view(n, nh, hd).transpose(0, 1)
        k = (y @ t[p + "self_attn.k_proj.weight"].T + t[p + "self_attn.k_proj.bias"]).view(n, nkv, hd).transpose(0, 1)
        v = (y @ t[p + "self_attn.v_proj.weight"].T + t[p + "self_attn.v_proj.bias"]).view(n, nkv, hd).transpose(0, 1)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + a.transpose(0, 1).reshape(n, h) @ t[p + "self_attn.o_proj.weight"].T
        y = rms(x, t[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(y @ t[p + "mlp.gate_proj.weight"].T) * (y @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
    return rms(x, t["model.norm.weight"]) @ t["lm_head.weight"].T


def test_checkpoint_matches_hf_reference(tmp_path):
    t = write_checkpoint(tmp_path)
    m = load_checkpoint(tmp_path)
    assert m.config.first_k_dense == m.config.num_layers == 2 and m.config.eos_token_id == 2
    toks = [3, 14, 15, 9, 26, 5]
    with torch.inference_mode():
        got = m(batch_for([(0, toks)]), kv(m.config))[0]
    want = hf_reference_logits(t, HF, toks)[-1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change,match", [({"model_type": "gpt2"}, "not supported"),
                                          ({"rope_scaling": {"type": "yarn"}}, "rope_scaling"),
                                          ({"num_attention_heads": None}, "num_attention_heads")])
def test_checkpoint_bad_config(tmp_path, change, match):
    write_checkpoint(tmp_path)
    hf = {**HF, **change}
    hf = {k: v for k, v in hf.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(UserError, match=match):
        load_checkpoint(tmp_path)


def test_checkpoint_missing_tensor(tmp_path):
    t = write_checkpoint(tmp_path)
    del t["model.layers.1.mlp.up_proj.weight"]
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="lacks tensor 'model.layers.1.mlp.up_proj.weight'"):
        load_checkpoint(tmp_path)
