"""Real CUDA graphs: FULL replay for uniform decode, PIECEWISE replay around eager attention.

The runner executes a step in the mode :func:`~.graph_dispatch.plan_graph` chose, padded to the
plan's bucket (a captured token count):

* **FULL** - the whole forward (embedding, every layer with its KV write and the Triton attention
  kernel, final norm, LM head over all bucket rows) captured once per bucket and replayed. Static
  inputs are copied into the graph's buffers first; the step's rows come first, the padding rows
  form one extra request over a scratch KV block (``pad_block``), and the remaining request slots
  are empty (``q_len = 0``: the kernel skips them), so one graph per token bucket serves any batch
  of ``<= bucket`` tokens whose shape is uniform decode.
* **PIECEWISE** - the same forward split at every attention call: the pieces between attention
  calls (norms, QKV projection, RoPE, the KV write through the static ``slot_mapping``, O
  projection, MLP/MoE) are captured per bucket; at replay, attention runs eagerly between piece
  ``i`` and piece ``i + 1`` on the real (unpadded) metadata, reading the piece's static ``q`` and
  writing the buffer the next piece reads. This is vLLM's piecewise split done with an attention
  hook instead of ``torch.compile`` graph splitting. The final norm and LM head run eagerly on the
  sampling rows only (vLLM's ``compute_logits`` is outside its graphs too).
* **NONE** - the model's eager forward.

Capture constraints the runner takes care of: the MoE layers' expert dispatch (which reads expert
counts back to the host) is replaced by :func:`dense_experts`, a fixed-shape equivalent, for every
mode, so all modes compute the same function; the attention backend inside FULL graphs is the
Triton kernel (the PyTorch reference syncs with the host). All pieces and graphs share one memory
pool and are replayed in capture order. A fault that changes model buffers (e.g. the EP router
bias) must change them in place to be seen by captured graphs.

CUDA only: on CPU the engine never builds a runner, and its records keep ``graph_replayed = 0``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from mixdiag.engine.hooks import NULL_TRACER

MODES = ("FULL", "PIECEWISE", "NONE")


def dense_experts(moe) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """A capture-safe ``experts_impl`` for ``moe``: every expert on every token, weighted by routing.

    Same contract as ``MoE.local_experts`` (``x[T,H], topk_ids[T,k], topk_weights[T,k] -> y[T,H]``)
    with fixed shapes and no host sync. Costs ``num_experts / top_k`` times the expert FLOPs: right
    for decode batches (memory-bound: every expert's weights are read anyway), wasteful for long
    prefill chunks.
    """

    def impl(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        w = torch.zeros(x.shape[0], moe.num_experts, dtype=x.dtype, device=x.device)
        w.scatter_add_(1, topk_ids, topk_weights.to(x.dtype))       # [T, E] combine weight per expert
        out = torch.zeros_like(x)
        for e in range(moe.num_experts):
            out += moe.expert(e, x) * w[:, e:e + 1]
        return out

    return impl


@dataclass
class _Static:
    """Graph input buffers, duck-typed like ``input_batch.ForwardBatch``."""

    input_ids: torch.Tensor        # int64 [N]
    positions: torch.Tensor        # int64 [N]
    slot_mapping: torch.Tensor     # int64 [N]
    query_start_loc: torch.Tensor  # int32 [N+1] (N request slots: enough for any batch of N tokens)
    seq_lens: torch.Tensor         # int32 [N]
    block_tables: torch.Tensor     # int32 [N, W]
    logits_indices: torch.Tensor   # int64 [N] = arange(N)


@dataclass(frozen=True)
class GraphRun:
    """How one step was executed."""

    mode: str          # FULL | PIECEWISE | NONE (what actually ran)
    bucket: int | None
    replayed: bool


class _Piecewise:
    """Captured pieces of one bucket and the attention calls between them."""

    def __init__(self):
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, torch.Tensor]] = []
        self.hidden: torch.Tensor | None = None  # [N, H] output of the last piece


class StaticInputs:
    """Allocates a bucket's graph input buffers and fills them from a batch (device-agnostic)."""

    def __init__(self, device, block_size: int, pad_block: int, width: int):
        self.device, self.block_size, self.pad_block, self.width = device, block_size, pad_block, width

    def new(self, n: int) -> _Static:
        d, i32, i64 = self.device, torch.int32, torch.int64
        return _Static(input_ids=torch.zeros(n, dtype=i64, device=d), positions=torch.zeros(n, dtype=i64, device=d),
                       slot_mapping=torch.zeros(n, dtype=i64, device=d),
                       query_start_loc=torch.zeros(n + 1, dtype=i32, device=d),
                       seq_lens=torch.zeros(n, dtype=i32, device=d),
                       block_tables=torch.full((n, self.width), self.pad_block, dtype=i32, device=d),
                       logits_indices=torch.arange(n, dtype=i64, device=d))

    def fill(self, s: _Static, batch) -> int:
        """Copy ``batch`` into ``s``; the rest of the bucket becomes one padding request. Returns T."""
        n = s.input_ids.shape[0]
        t = int(batch.input_ids.shape[0])
        b = int(batch.seq_lens.shape[0])
        if t > n or b > n:
            raise ValueError(f"batch of {t} tokens / {b} requests does not fit bucket {n}")
        if batch.block_tables.shape[1] > self.width:
            raise ValueError(f"block table of {batch.block_tables.shape[1]} blocks exceeds graph width {self.width}")
        pad = n - t
        s.input_ids[:t].copy_(batch.input_ids)
        s.positions[:t].copy_(batch.positions)
        s.slot_mapping[:t].copy_(batch.slot_mapping)
        s.query_start_loc[:b + 1].copy_(batch.query_start_loc)
        s.seq_lens[:b].copy_(batch.seq_lens)
        w = batch.block_tables.shape[1]
        s.block_tables[:b, :w].copy_(batch.block_tables)
        s.block_tables[:b, w:].fill_(self.pad_block)
        s.block_tables[b:].fill_(self.pad_block)
        if pad:
            # Padding rows: one extra request over the scratch block (positions 0..pad-1), so
            # they write and read only pad_block and never touch a real request's KV.
            p = torch.arange(pad, device=self.device)
            s.input_ids[t:].zero_()
            s.positions[t:].copy_(p)
            s.slot_mapping[t:].copy_(self.pad_block * self.block_size + p % self.block_size)
        s.query_start_loc[b + 1:].fill_(n)  # request b = the padding rows; later slots are empty
        s.seq_lens[b:].zero_()
        if b < n:
            s.seq_lens[b] = pad
        return t

    def fill_padding_only(self, s: _Static) -> None:
        """Valid contents for warm-up and capture: the whole bucket is the padding request."""
        empty = _Static(input_ids=s.input_ids[:0], positions=s.positions[:0], slot_mapping=s.slot_mapping[:0],
                        query_start_loc=s.query_start_loc[:1].zero_(), seq_lens=s.seq_lens[:0],
                        block_tables=s.block_tables[:0], logits_indices=s.logits_indices[:0])
        self.fill(s, empty)


class CudaGraphRunner:
    """Captures FULL and PIECEWISE graphs per bucket for ``model`` and executes planned steps.

    ``kv_cache`` is the engine's pool [layers, 2, num_blocks, block_size, Hkv, D]; ``pad_block``
    must be a block the block manager never hands out (allocate the pool with one extra block).
    ``attn_backend`` is the eager attention (FULL graphs capture it, so it must not sync).
    """

    def __init__(self, model, kv_cache: torch.Tensor, *, capture_sizes: Sequence[int], pad_block: int,
                 max_blocks_per_req: int, attn_backend: Callable, full: bool = True, piecewise: bool = True):
        if kv_cache.device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError("CudaGraphRunner needs a CUDA device; on CPU steps run eagerly")
        if not 0 <= pad_block < kv_cache.shape[2]:
            raise ValueError(f"pad_block {pad_block} is outside the KV pool of {kv_cache.shape[2]} blocks")
        self.model = model
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.inputs = StaticInputs(self.device, kv_cache.shape[3], pad_block, max_blocks_per_req)
        self.attn_backend = attn_backend
        self.sizes = tuple(sorted(set(int(s) for s in capture_sizes)))
        self.want_full, self.want_piecewise = full, piecewise
        self.full: dict[int, tuple[torch.cuda.CUDAGraph, _Static, torch.Tensor]] = {}
        self.pieces: dict[int, tuple[_Piecewise, _Static]] = {}
        self.replays: Counter = Counter()  # mode -> real graph replays
        self.pool = None
        self._moes = list(getattr(model, "moe_layers", []))
        for moe in self._moes:
            if moe.experts_impl != moe.local_experts:  # expert parallel: all-to-all is not capturable here
                raise RuntimeError("CUDA graphs need the in-process experts; run expert-parallel engines eagerly")
            moe.experts_impl = dense_experts(moe)
        self._dense = [m.experts_impl for m in self._moes]
        model.attn_backend = attn_backend

    # ---- capture -----------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first (smaller graphs reuse the pool's memory)."""
        self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        tracer, self.model.tracer = self.model.tracer, NULL_TRACER  # no profiler hooks inside a capture
        try:
            with torch.cuda.stream(stream):
                for n in reversed(self.sizes):
                    if self.want_full:
                        self._capture_full(n)
                    if self.want_piecewise:
                        self._capture_piecewise(n)
        finally:
            self.model.tracer = tracer
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def _capture_full(self, n: int) -> None:
        s = self.inputs.new(n)
        self.inputs.fill_padding_only(s)
        for _ in range(2):  # warm-up: Triton compile, cuBLAS workspaces, allocator
            self.model(s, self.kv_cache)
        torch.cuda.synchronize(self.device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=torch.cuda.current_stream(self.device)):
            logits = self.model(s, self.kv_cache)  # [N, V]
        self.full[n] = (g, s, logits)

    def _layers(self, s: _Static) -> torch.Tensor:
        """The model's forward up to the last layer's output (``Model.forward`` without the head)."""
        m = self.model
        x = m.embed(s.input_ids)
        for i, layer in enumerate(m.layers):
            x = layer(x, s, self.kv_cache[i], m.rotary, m.attn_backend, m.tracer)
        return x

    def _capture_piecewise(self, n: int) -> None:
        s = self.inputs.new(n)
        self.inputs.fill_padding_only(s)
        for _ in range(2):
            self._layers(s)
        torch.cuda.synchronize(self.device)
        pw = _Piecewise()
        pool = self.pool

        def split_here(q, k_cache, v_cache, qsl, seq_lens, block_tables, scale):
            # End the current piece; attention's output is a static buffer the next piece reads.
            pw.graphs[-1].capture_end()
            out = torch.empty_like(q)
            pw.calls.append((q, k_cache, v_cache, float(scale), out))
            g = torch.cuda.CUDAGraph()
            pw.graphs.append(g)
            g.capture_begin(pool=pool)
            return out

        g0 = torch.cuda.CUDAGraph()
        pw.graphs.append(g0)
        self.model.attn_backend = split_here
        try:
            g0.capture_begin(pool=pool)
            try:
                pw.hidden = self._layers(s)
            finally:
                pw.graphs[-1].capture_end()
        finally:
            self.model.attn_backend = self.attn_backend
        self.pieces[n] = (pw, s)

    # ---- execution ---------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, batch, mode: str, bucket: int | None) -> tuple[torch.Tensor, GraphRun]:
        """Logits [S, V] for ``batch`` (a ForwardBatch) run in ``mode`` padded to ``bucket``.

        Runs eagerly (NONE) when the graph is missing or the MoE layers no longer use the captured
        experts (e.g. expert parallelism attached after capture): a stale graph is never replayed.
        """
        if any(m.experts_impl is not d for m, d in zip(self._moes, self._dense)):
            mode = "NONE"
        if mode == "FULL" and bucket in self.full:
            g, s, logits = self.full[bucket]
            self.inputs.fill(s, batch)
            g.replay()
            self.replays["FULL"] += 1
            return logits.index_select(0, batch.logits_indices), GraphRun("FULL", bucket, True)
        if mode in ("FULL", "PIECEWISE") and bucket in self.pieces:
            pw, s = self.pieces[bucket]
            t = self.inputs.fill(s, batch)
            for g, (q, k_cache, v_cache, scale, out) in zip(pw.graphs, pw.calls):
                g.replay()
                out[:t].copy_(self.attn_backend(q[:t], k_cache, v_cache, batch.query_start_loc, batch.seq_lens,
                                                batch.block_tables, scale))
            pw.graphs[-1].replay()
            self.replays["PIECEWISE"] += 1
            m = self.model
            x = pw.hidden[:t].index_select(0, batch.logits_indices)
            return m.lm_head(m.norm(x)), GraphRun("PIECEWISE", bucket, True)
        return self.model(batch, self.kv_cache), GraphRun("NONE", None, False)


def graphs_enabled(config, device) -> bool:
    """Whether an engine with ``config`` (an EngineConfig) captures CUDA graphs on ``device``."""
    s = config.scheduler
    return (torch.device(device).type == "cuda" and not s.enforce_eager and s.cudagraph_mode != "NONE"
            and bool(s.cudagraph_capture_sizes))


def build_runner(model, kv_cache: torch.Tensor, config, attn_backend: Callable) -> CudaGraphRunner:
    """A runner for an engine's model and KV pool (allocated with one scratch block past the
    pool's ``num_blocks``), graphs captured as ``cudagraph_mode`` asks."""
    s, c = config.scheduler, config.cache
    mode = s.cudagraph_mode
    runner = CudaGraphRunner(model, kv_cache, capture_sizes=s.cudagraph_capture_sizes, pad_block=c.num_blocks,
                             max_blocks_per_req=-(-config.model.max_model_len // c.block_size) + 1,
                             attn_backend=attn_backend, full=mode in ("FULL_AND_PIECEWISE", "FULL"),
                             piecewise=mode in ("FULL_AND_PIECEWISE", "PIECEWISE"))
    runner.capture()
    return runner
