"""Expert parallelism over processes: experts sharded across ranks, all-to-all dispatch and combine.

The engine process is rank 0: it runs attention and the router, owns expert shard 0, and drives
every collective. Ranks 1..W-1 are expert-worker processes (spawned here) that own the other
shards and serve MoE calls in a loop. Experts are sharded contiguously: rank ``r`` owns experts
``[r*E/W, (r+1)*E/W)``.

One MoE call (``ExpertParallel.experts``), all ranks in lock-step:

1. rank 0 broadcasts a header ``[op, layer, rounds]``;
2. per round: ``all_to_all_single`` of row counts (every rank learns what it receives), then of
   the hidden rows and of their local expert ids (dispatch), local expert compute, and the
   reverse ``all_to_all_single`` of the outputs (combine);
3. rank 0 weights and sums the rows back per token.

A row is one (token, top-k slot) assignment. ``capacity_factor`` bounds the rows one rank takes
per round to ``ceil(capacity_factor * rows / W)`` (GShard's expert capacity, applied per rank like
the fixed receive buffers of low-latency EP kernels, DeepEP's ``num_max_dispatch_tokens_per_rank``);
instead of dropping the overflow, a rank that gets more than its share needs more rounds, and every
round is a full dispatch/compute/combine that all ranks wait on - so the step's time tracks the
busiest rank, as it does on GPUs (rounds = ceil(imbalance / capacity_factor)). Per-rank row
counts are accumulated per step for ``StepRecord.per_rank_tokens`` and the imbalance (max/mean).
"""
from __future__ import annotations

import functools
import math
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

_OP_STOP, _OP_MOE = 0, 1


@dataclass(frozen=True)
class EPConfig:
    """Expert-parallel layout: how many ranks (the engine is rank 0) and the per-round capacity."""

    world_size: int = 4
    backend: str = "auto"  # gloo | nccl | auto (nccl when the experts live on CUDA and every rank has a GPU)
    capacity_factor: float = 0.0  # per-round rows per rank = ceil(factor * rows / W); 0 = no limit
    worker_threads: int = 1  # torch intra-op threads per expert worker
    timeout_s: float = 120.0

    def __post_init__(self):
        if not isinstance(self.world_size, int) or self.world_size < 2:
            raise ValueError(f"ep.world_size must be an integer >= 2, got {self.world_size!r}")
        if self.backend not in ("gloo", "nccl", "auto"):
            raise ValueError(f"ep.backend must be gloo, nccl or auto, got {self.backend!r}")
        if not isinstance(self.capacity_factor, (int, float)) or not (
                self.capacity_factor == 0 or self.capacity_factor >= 1):
            raise ValueError(f"ep.capacity_factor must be 0 (no limit) or >= 1, got {self.capacity_factor!r}")
        if not isinstance(self.worker_threads, int) or self.worker_threads < 1:
            raise ValueError(f"ep.worker_threads must be an integer >= 1, got {self.worker_threads!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"ep.timeout_s must be > 0, got {self.timeout_s!r}")


@dataclass(frozen=True)
class ExpertWeights:
    """Experts of one MoE layer in :class:`~.moe.MoE`'s layout: w13 [E, 2I, H] (gate|up), w2 [E, H, I]."""

    w13: torch.Tensor
    w2: torch.Tensor

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @classmethod
    def of(cls, moe) -> "ExpertWeights":
        """The (detached) expert weights of a :class:`~.moe.MoE` layer."""
        return cls(moe.w13.detach(), moe.w2.detach())

    def shard(self, rank: int, world_size: int) -> "ExpertWeights":
        lo, hi = expert_range(self.num_experts, rank, world_size)
        return ExpertWeights(self.w13[lo:hi].contiguous(), self.w2[lo:hi].contiguous())

    def to(self, device) -> "ExpertWeights":
        return ExpertWeights(self.w13.to(device), self.w2.to(device))


def expert_range(num_experts: int, rank: int, world_size: int) -> tuple[int, int]:
    """[lo, hi) of the experts rank ``rank`` owns (contiguous, equal shards)."""
    per = num_experts // world_size
    return rank * per, (rank + 1) * per


def check_shardable(num_experts: int, world_size: int, top_k: int = 1) -> None:
    """Raise ValueError unless E splits evenly over the ranks (and a rank can hold all top-k)."""
    if num_experts % world_size:
        raise ValueError(f"{num_experts} experts do not split evenly over {world_size} EP ranks")
    if num_experts // world_size < top_k:
        raise ValueError(f"{num_experts // world_size} experts per rank is fewer than top_k={top_k}")


def expert_forward(w: ExpertWeights, local_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Rows ``x`` [n, H] through their local experts ``local_ids`` [n]; returns [n, H]."""
    out = torch.empty_like(x)
    if x.shape[0] == 0:
        return out
    order = torch.argsort(local_ids, stable=True)
    ids_sorted = local_ids[order]
    counts = torch.bincount(ids_sorted, minlength=w.num_experts).tolist()
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        idx = order[start:start + n]
        g, u = F.linear(x[idx], w.w13[e]).chunk(2, dim=-1)  # [n, I] each, as MoE.expert
        out[idx] = F.linear(F.silu(g) * u, w.w2[e])
        start += n
    return out


def local_experts(w: ExpertWeights, x: torch.Tensor, topk_ids: torch.Tensor,
                  topk_weights: torch.Tensor) -> torch.Tensor:
    """The single-process reference: x [T, H], topk_ids/topk_weights [T, k] -> [T, H]."""
    T, k = topk_ids.shape
    rows = x.repeat_interleave(k, dim=0)  # [T*k, H], row t*k+j is (token t, slot j)
    y = expert_forward(w, topk_ids.reshape(-1), rows)
    return (y.view(T, k, -1) * topk_weights.unsqueeze(-1).to(y.dtype)).sum(dim=1)


def hotspot_bias(num_experts: int, world_size: int, hot_rank: int, strength: float) -> torch.Tensor:
    """Router bias [E] that adds ``strength`` to the logits of the experts ``hot_rank`` owns."""
    if not 0 <= hot_rank < world_size:
        raise ValueError(f"hot_rank must be in [0, {world_size}), got {hot_rank}")
    bias = torch.zeros(num_experts)
    lo, hi = expert_range(num_experts, hot_rank, world_size)
    bias[lo:hi] = strength
    return bias


def imbalance(per_rank_tokens) -> float:
    """max / mean of the per-rank row counts (1 = balanced); NaN when nothing was routed."""
    vals = [float(v) for v in per_rank_tokens]
    total = sum(vals)
    if not vals or total == 0:
        return math.nan
    return max(vals) / (total / len(vals))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _round_splits(counts: list[int], cap: int, rounds: int) -> list[list[int]]:
    """Split per-rank row counts into ``rounds`` rounds of at most ``cap`` rows per rank."""
    out = []
    left = list(counts)
    for _ in range(rounds):
        take = [min(c, cap) if cap else c for c in left]
        out.append(take)
        left = [c - t for c, t in zip(left, take)]
    return out


def _serve_round(shard: ExpertWeights, world: int, device: torch.device, hidden: int, dtype: torch.dtype,
                 send_counts: list[int], send_x: torch.Tensor, send_ids: torch.Tensor) -> torch.Tensor:
    """One dispatch/compute/combine round on any rank; returns the rows this rank gets back."""
    sc = torch.tensor(send_counts, dtype=torch.int64, device=device)  # NCCL needs device tensors
    rc = torch.empty(world, dtype=torch.int64, device=device)
    dist.all_to_all_single(rc, sc)
    recv_counts = rc.tolist()
    n_in = sum(recv_counts)
    recv_x = torch.empty(n_in, hidden, dtype=dtype, device=device)
    recv_ids = torch.empty(n_in, dtype=torch.int64, device=device)
    dist.all_to_all_single(recv_x, send_x, output_split_sizes=recv_counts, input_split_sizes=send_counts)
    dist.all_to_all_single(recv_ids, send_ids, output_split_sizes=recv_counts, input_split_sizes=send_counts)
    y = expert_forward(shard, recv_ids, recv_x)
    back = torch.empty(sum(send_counts), hidden, dtype=dtype, device=device)
    dist.all_to_all_single(back, y, output_split_sizes=send_counts, input_split_sizes=recv_counts)
    return back


def _worker(rank: int, world: int, port: int, backend: str, threads: int, timeout_s: float,
            shards: list[ExpertWeights], device: str) -> None:
    """Expert worker main loop: serve MoE calls until rank 0 broadcasts stop."""
    import datetime

    torch.set_num_threads(threads)
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    shards = [s.to(dev) for s in shards]
    hidden = shards[0].w13.shape[2]
    dtype = shards[0].w13.dtype
    try:
        while True:
            hdr = torch.empty(3, dtype=torch.int64, device=dev if backend == "nccl" else "cpu")
            dist.broadcast(hdr, src=0)
            op, layer, rounds = (int(v) for v in hdr.tolist())
            if op == _OP_STOP:
                break
            for _ in range(rounds):
                _serve_round(shards[layer], world, dev, hidden, dtype, [0] * world,
                             torch.empty(0, hidden, dtype=dtype, device=dev),
                             torch.empty(0, dtype=torch.int64, device=dev))
    finally:
        dist.destroy_process_group()


class ExpertParallel:
    """Rank 0's handle: spawns the expert workers and runs MoE calls across all ranks.

    ``layers`` holds the full expert weights of each MoE layer (index = the ``layer`` argument
    of :meth:`experts`); each worker receives only its shard. Use as a context manager or call
    :meth:`close`. Per-step accounting: :meth:`take_step_counts` returns and resets the rows
    each rank received since the last call.
    """

    def __init__(self, config: EPConfig, layers: list[ExpertWeights]):
        import datetime

        if not layers:
            raise ValueError("expert parallelism needs at least one MoE layer")
        self.config = config
        self.world = config.world_size
        self.num_experts = layers[0].num_experts
        check_shardable(self.num_experts, self.world)
        self.per_rank = self.num_experts // self.world
        model_dev = layers[0].w13.device
        backend = config.backend
        if backend == "auto":  # NCCL wants one GPU per rank; otherwise exchange and compute experts on CPU
            cuda_ok = model_dev.type == "cuda" and torch.cuda.device_count() >= self.world
            backend = "nccl" if cuda_ok else "gloo"
        if backend == "nccl" and model_dev.type != "cuda":
            raise ValueError("ep backend nccl needs the model on CUDA")
        self.backend = backend
        self.model_device = model_dev
        dev = model_dev if backend == "nccl" else torch.device("cpu")
        self.device = dev
        self.hidden = layers[0].w13.shape[2]
        self.dtype = layers[0].w13.dtype
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialised in this process; one EP group per process")
        port = _free_port()
        ctx = mp.get_context("spawn")
        self._procs = []
        for r in range(1, self.world):
            shards = [lw.shard(r, self.world) for lw in layers]
            wdev = f"cuda:{r}" if dev.type == "cuda" else "cpu"
            if dev.type != "cuda":
                shards = [s.to("cpu") for s in shards]
            p = ctx.Process(target=_worker, args=(r, self.world, port, backend, config.worker_threads,
                                                  config.timeout_s, shards, wdev), daemon=True)
            p.start()
            self._procs.append(p)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=self.world,
                                timeout=datetime.timedelta(seconds=config.timeout_s))
        self._shards = [lw.shard(0, self.world).to(dev) for lw in layers]
        self._counts = [0] * self.world
        self._rounds = 0
        self._closed = False
        self._moes: list = []

    @classmethod
    def attach(cls, model, config: EPConfig) -> "ExpertParallel":
        """Shard ``model``'s MoE layers over ``config.world_size`` ranks and route them through EP.

        Every ``MoE.experts_impl`` of the model becomes this group's :meth:`experts` for its
        layer; :meth:`close` puts the local implementation back.
        """
        moes = list(model.moe_layers)
        if not moes:
            raise ValueError("the model has no MoE layers to shard")
        for m in moes:
            check_shardable(m.num_experts, config.world_size, m.top_k)
        ep = cls(config, [ExpertWeights.of(m) for m in moes])
        for i, m in enumerate(moes):
            m.experts_impl = functools.partial(ep.experts, i)
        ep._moes = moes
        return ep

    def set_router_bias(self, bias: torch.Tensor | None) -> None:
        """Set (``None``: zero) the ``router_bias`` [E] of every attached MoE layer."""
        for m in self._moes:
            if bias is None:
                m.router_bias.zero_()
            else:
                m.router_bias.copy_(bias.to(m.router_bias))

    # ---- one MoE call ----------------------------------------------------------------------
    def experts(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        """Dispatch x [T, H] to the ranks owning ``topk_ids`` [T, k], combine with ``topk_weights``."""
        if self._closed:
            raise RuntimeError("expert-parallel group is closed")
        T, k = topk_ids.shape
        flat = topk_ids.reshape(-1)  # [T*k]
        dst = torch.div(flat, self.per_rank, rounding_mode="floor")
        order = torch.argsort(dst, stable=True)  # rows grouped by destination rank
        counts = torch.bincount(dst, minlength=self.world).tolist()
        rows = x.repeat_interleave(k, dim=0)[order].to(device=self.device, dtype=self.dtype)  # [T*k, H]
        local_ids = (flat - dst * self.per_rank)[order].to(self.device)
        order = order.to(self.device)
        f = self.config.capacity_factor
        cap = math.ceil(f * T * k / self.world) if f else 0
        rounds = max(1, max(math.ceil(c / cap) for c in counts)) if cap else 1
        hdr = torch.tensor([_OP_MOE, layer, rounds], dtype=torch.int64,
                           device=self.device if self.backend == "nccl" else "cpu")
        dist.broadcast(hdr, src=0)
        # rows of rank r start at offset[r] in ``order``; each round takes the next <= cap of them
        offset = [0] * self.world
        acc = 0
        for r, c in enumerate(counts):
            offset[r] = acc
            acc += c
        taken = [0] * self.world
        y_sorted = torch.empty_like(rows)
        for split in _round_splits(counts, cap, rounds):
            sel = torch.cat([torch.arange(offset[r] + taken[r], offset[r] + taken[r] + split[r])
                             for r in range(self.world)]) if any(split) else torch.empty(0, dtype=torch.int64)
            sel = sel.to(rows.device)
            back = _serve_round(self._shards[layer], self.world, self.device, self.hidden, self.dtype,
                                split, rows[sel], local_ids[sel])
            y_sorted[sel] = back
            taken = [t + s for t, s in zip(taken, split)]
        y = torch.empty_like(y_sorted)
        y[order] = y_sorted
        self._counts = [a + b for a, b in zip(self._counts, counts)]
        self._rounds += rounds
        out = (y.view(T, k, -1) * topk_weights.unsqueeze(-1).to(device=y.device, dtype=y.dtype)).sum(dim=1)
        return out.to(device=x.device, dtype=x.dtype)

    def take_step_counts(self) -> tuple[list[int], int]:
        """(rows per rank, rounds) accumulated since the last call, over all MoE layers; resets."""
        c, r = self._counts, self._rounds
        self._counts, self._rounds = [0] * self.world, 0
        return c, r

    # ---- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the workers and tear down the process group (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for m in self._moes:
            m.experts_impl = m.local_experts
        try:
            hdr = torch.tensor([_OP_STOP, 0, 0], dtype=torch.int64,
                               device=self.device if self.backend == "nccl" else "cpu")
            dist.broadcast(hdr, src=0)
        finally:
            dist.destroy_process_group()
            for p in self._procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
