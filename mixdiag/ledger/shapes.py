"""The shape ledger: the article's "mixed step vs pure-decode step" table for any MoE/MLA model and
batch shape - pure arithmetic, every row with its unit and scope.

Shape: ``P`` prefill tokens in the chunk, ``R`` decode requests with ``K`` speculative tokens
each (``D = R x (K+1)`` decode rows), context length ``C``; ``N = P + D`` rows in the mixed step.

Rows (``scope`` says what one figure covers):

* ``dp_gather_bytes``       ``rows x hidden x 2`` (BF16 all-gather of the DP-attention batch), per layer
                            as the article's table counts it ("once per layer").
* ``moe_dispatch_bytes``    ``rows x top_k x hidden x 1`` (FP8), per MoE layer.
* ``moe_combine_bytes``     ``rows x top_k x hidden x 2`` (BF16), per MoE layer.
* ``moe_total_bytes_all_layers``  ``(dispatch + combine) x moe_layers``. The article's "75 layers
                            total 28 MB" pure-decode figure is one layer's dispatch+combine; over 75
                            layers it is ~2.1 GB, and mixed/decode is ~44x on every MoE row.
* ``decode_kv_read_bytes``  ``D x min(index_topk, C) x kv_bytes_per_token``: the decode segment's
                            sparse-attention KV read per layer - the same in both steps (the prefill
                            chunk's own reads are counted separately by the article).
* ``indexer_score_elements`` decode ``D x C``; mixed adds ``P x prefix + P^2 / 2``; per indexer layer.
* ``mtp_rows``              MTP verification rows: ``D`` in both (prefill rows have no drafts).
* ``graph_mode``            FULL for uniform decode within the captured sizes; the mixed step
                            cannot replay FULL (PIECEWISE, or NONE above the largest size).
"""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from mixdiag.errors import UserError


@dataclass(frozen=True)
class LedgerModel:
    """The model constants the ledger and the device model need."""

    name: str
    num_layers: int              # decoder layers (MTP excluded)
    hidden_size: int
    first_dense_layers: int      # leading dense-MLP layers; the rest are MoE
    n_routed_experts: int
    top_k: int
    moe_intermediate_size: int
    dense_intermediate_size: int
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kv_bytes_per_token: int      # MLA KV per token per layer (656 B in FP8 with scales and BF16 RoPE)
    index_topk: int              # sparse attention: keys each query attends to
    indexer_layers: int          # layers running the lightning indexer
    index_n_heads: int
    index_head_dim: int
    mtp_layers: int
    n_shared_experts: int = 1
    vocab_size: int = 154880
    dispatch_bytes_per_elem: int = 1   # FP8 dispatch
    combine_bytes_per_elem: int = 2    # BF16 combine
    gather_bytes_per_elem: int = 2     # BF16 DP gather
    weight_bytes_per_param: float = 1.0  # FP8 weights
    max_graph_batch: int = 512         # largest captured CUDA-graph size (decode rows)

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "name":
                if not isinstance(v, str) or not v:
                    raise UserError("model config: 'name' must be a non-empty string")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise UserError(f"model config: '{f.name}' must be a non-negative number, got {v!r}")
        if self.first_dense_layers > self.num_layers:
            raise UserError("model config: 'first_dense_layers' exceeds 'num_layers'")
        if not 0 < self.top_k <= self.n_routed_experts:
            raise UserError("model config: 'top_k' must be in 1..n_routed_experts")
        if self.hidden_size <= 0 or self.num_layers <= 0:
            raise UserError("model config: 'hidden_size' and 'num_layers' must be positive")

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    # parameter counts (device model)
    def attn_params_per_layer(self) -> int:
        h, nh = self.hidden_size, self.num_heads
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        return (h * (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim)  # A projection
                + self.q_lora_rank * nh * qk                                          # Q up
                + self.kv_lora_rank * nh * (self.qk_nope_head_dim + self.v_head_dim)  # KV up
                + nh * self.v_head_dim * h)                                           # O

    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    def active_params(self) -> int:
        """Parameters one token touches (attention + dense MLP or top_k + shared experts)."""
        dense = 3 * self.hidden_size * self.dense_intermediate_size
        moe = (self.top_k + self.n_shared_experts) * self.expert_params()
        return (self.num_layers * self.attn_params_per_layer() + self.first_dense_layers * dense
                + self.moe_layers * moe + 2 * self.vocab_size * self.hidden_size)


PRESETS: dict[str, LedgerModel] = {
    # The article's constants: 78 layers, hidden 6144, 3 dense + 75 MoE, 8 of 256 experts, MLA
    # (A proj 2048+512+64, Q up 64x256, KV up 64x(192+256)), 656 B/token FP8 KV, index top-k 2048,
    # indexer on 21 layers, 1 MTP layer, dense MLP 6144->12288. Expert width 2048 and vocab are
    # not in the article (taken from the GLM-5 family; they only feed the device model).
    "glm-5.3": LedgerModel(name="glm-5.3", num_layers=78, hidden_size=6144, first_dense_layers=3,
                           n_routed_experts=256, top_k=8, moe_intermediate_size=2048,
                           dense_intermediate_size=12288, num_heads=64, q_lora_rank=2048, kv_lora_rank=512,
                           qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, kv_bytes_per_token=656,
                           index_topk=2048, indexer_layers=21, index_n_heads=32, index_head_dim=128,
                           mtp_layers=1, vocab_size=154880),
    # DeepSeek-V3.2 (config.json of deepseek-ai/DeepSeek-V3.2-Exp): 61 layers, hidden 7168, 3 dense,
    # 8 of 256 experts, expert width 2048, DSA indexer on every layer (64 heads x 128, top-k 2048).
    "deepseek-v3.2": LedgerModel(name="deepseek-v3.2", num_layers=61, hidden_size=7168, first_dense_layers=3,
                                 n_routed_experts=256, top_k=8, moe_intermediate_size=2048,
                                 dense_intermediate_size=18432, num_heads=128, q_lora_rank=1536,
                                 kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                 kv_bytes_per_token=656, index_topk=2048, indexer_layers=61, index_n_heads=64,
                                 index_head_dim=128, mtp_layers=1, vocab_size=129280),
}


def load_config(path: str | Path) -> LedgerModel:
    """A LedgerModel from a JSON or TOML file (keys = LedgerModel fields)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"no such model config file: {p}")
    text = p.read_bytes()
    try:
        import tomllib  # Python >= 3.11; JSON configs work everywhere
    except ImportError:  # pragma: no cover - Python 3.10
        tomllib = None
    if tomllib is None and p.suffix.lower() == ".toml":
        raise UserError(f"{p}: TOML model configs need Python 3.11+; write the config as JSON")
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text.decode())
        elif p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            try:
                data = json.loads(text)
            except ValueError:
                if tomllib is None:
                    raise
                data = tomllib.loads(text.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: not a JSON or TOML model config ({str(e).splitlines()[0]})") from None
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        data = data["model"]
    if not isinstance(data, dict):
        raise UserError(f"{p}: a model config must be an object/table of fields")
    known = {f.name for f in fields(LedgerModel)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{p}: unknown model config key(s): {', '.join(unknown)}")
    missing = sorted(f.name for f in fields(LedgerModel) if f.name not in data and f.default is MISSING)
    if missing:
        raise UserError(f"{p}: missing model config key(s): {', '.join(missing)}")
    return LedgerModel(**data)


def resolve(preset: str | None = None, config: str | Path | None = None) -> LedgerModel:
    """The model of ``--preset`` or ``--config`` (config wins when both are given)."""
    if config is not None:
        return load_config(config)
    name = preset or "glm-5.3"
    if name not in PRESETS:
        raise UserError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class BatchShape:
    """One mixed step: a prefill chunk plus the running decodes (the pure-decode step drops the chunk)."""

    prefill_tokens: int = 8192
    decode_reqs: int = 32
    spec_tokens: int = 0
    context_len: int = 131072
    prefix_len: int = 0      # tokens of the chunk's request already in KV (earlier chunks / cache hits)

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UserError(f"--{f.name.replace('_', '-')} must be a non-negative integer, got {v!r}")

    @property
    def decode_rows(self) -> int:
        return self.decode_reqs * (self.spec_tokens + 1)

    @property
    def mixed_rows(self) -> int:
        return self.prefill_tokens + self.decode_rows


def _row(decode, mixed, unit: str, scope: str, note: str | None = None) -> dict:
    r = {"decode": decode, "mixed": mixed, "unit": unit, "scope": scope}
    if isinstance(decode, (int, float)) and isinstance(mixed, (int, float)):
        r["ratio"] = round(mixed / decode, 3) if decode else None
    if note:
        r["note"] = note
    return r


def ledger(model: LedgerModel, shape: BatchShape) -> dict:
    """The ledger rows for ``model`` and ``shape`` (the ``mixdiag ledger --json`` document)."""
    m, D, N, P = model, shape.decode_rows, shape.mixed_rows, shape.prefill_tokens
    gather = lambda rows: rows * m.hidden_size * m.gather_bytes_per_elem  # noqa: E731
    dispatch = lambda rows: rows * m.top_k * m.hidden_size * m.dispatch_bytes_per_elem  # noqa: E731
    combine = lambda rows: rows * m.top_k * m.hidden_size * m.combine_bytes_per_elem  # noqa: E731
    kv_keys = min(m.index_topk, shape.context_len)
    kv_decode = D * kv_keys * m.kv_bytes_per_token
    idx_decode = D * shape.context_len
    idx_mixed = idx_decode + P * shape.prefix_len + P * P // 2
    graph_decode = "FULL" if 0 < D <= m.max_graph_batch else ("NONE" if D else "n/a")
    # A mixed step never replays FULL; piecewise graphs exist only up to the largest captured size.
    graph_mixed = "PIECEWISE" if N <= m.max_graph_batch else "NONE"
    rows = {
        "dp_gather_bytes": _row(gather(D), gather(N), "bytes", "per_layer",
                                "one BF16 all-gather of all rows; the article's table counts it once per layer"),
        "moe_dispatch_bytes": _row(dispatch(D), dispatch(N), "bytes", "per_layer", "FP8, rows x top_k x hidden"),
        "moe_combine_bytes": _row(combine(D), combine(N), "bytes", "per_layer", "BF16, 2x dispatch"),
        "moe_total_bytes_all_layers": _row((dispatch(D) + combine(D)) * m.moe_layers,
                                           (dispatch(N) + combine(N)) * m.moe_layers, "bytes", "all_layers",
                                           f"dispatch+combine over {m.moe_layers} MoE layers; the article's "
                                           f"'75 layers total' decode figure (28 MB) is one layer's"),
        "decode_kv_read_bytes": _row(kv_decode, kv_decode, "bytes", "per_layer",
                                     f"decode rows x {kv_keys} top-k keys x {m.kv_bytes_per_token} B; the "
                                     "prefill chunk's own KV reads come on top in the mixed step"),
        "indexer_score_elements": _row(idx_decode, idx_mixed, "elements", "per_layer",
                                       f"per indexer layer ({m.indexer_layers} layers); decode rows x context "
                                       "+ prefill P x prefix + P^2/2"),
        "mtp_rows": _row(D if m.mtp_layers else 0, D if m.mtp_layers else 0, "rows", "per_step",
                         "MTP verifies decode rows only"),
        "graph_mode": _row(graph_decode, graph_mixed, "mode", "per_step",
                           f"FULL needs uniform decode within {m.max_graph_batch} captured rows; mixed: PIECEWISE "
                           "within the captured sizes, else eager (NONE)"),
    }
    return {"model": m.name, "shape": asdict(shape) | {"decode_rows": D, "mixed_rows": N},
            **rows, "rows_total": {"decode": D, "mixed": N}}


def config_dict(model: LedgerModel) -> dict:
    """The model as a plain dict (what ``--config`` reads back)."""
    return asdict(model)
