"""The step loop: every rank's engine thread (CPU) and compute stream (GPU), step by step.

Per step and rank, two passes. CPU pass: schedule + prepare, input copies, kernel / graph
launches (each op gets the end of the API call that issued it), then the wait for sampled ids.
GPU pass, all ranks together: an op starts when its stream is free and its launch returned; an
all-to-all ends when the last rank has arrived (+ its latency), so the other ranks wait inside
it - the EP coupling. Rows go to a :class:`Rows` for the writer; truth per (step, rank).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .kernels import COMM_SM, NAMES, Costs, step_ops
from .schedule import Schedule
from .shapes import Shape

COMPUTE_STREAM, OUTPUT_STREAM, KV_STREAM = 7, 13, 21
#: vLLM max_num_seqs: the padded request buffers' length (1024: the serving default on H100-class
#: GPUs in vllm/engine/arg_utils.py usage-context defaults; UNVERIFIED for every version)
MAX_SEQS = 1024
# CUPTI CUpti_ActivityMemcpyKind: 1 HTOD, 2 DTOH; CUpti_ActivityMemoryKind: 2 PINNED, 3 DEVICE
HTOD, DTOH, PINNED, DEVICE = 1, 2, 2, 3


@dataclass
class Rows:
    """Export rows, one list per table (column order as nsys_db's INSERTs)."""

    strings: dict = field(default_factory=dict)
    kernels: list = field(default_factory=list)     # start, end, dev, stream, corr, gpid, short, demangled, graphId, nodeId
    graphs: list = field(default_factory=list)      # start, end, dev, stream, corr, gpid, graphId, execId
    memcpy: list = field(default_factory=list)      # start, end, dev, stream, corr, gpid, bytes, kind, src, dst
    runtime: list = field(default_factory=list)     # start, end, gtid, corr, nameId
    nvtx: list = field(default_factory=list)        # start, end, text, gtid
    busy: dict = field(default_factory=dict)        # device -> [(start, end, sm share)]

    def sid(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings) + 1)


@dataclass
class Proc:
    """One rank's process: ids and clocks (ns)."""

    rank: int
    pid: int
    cpu: float
    gpu: float
    side: float = 0.0
    corr: int = 0
    out_prev: float = 0.0  # previous step's sampled-id copy end (lag 1)

    @property
    def gpid(self) -> int:
        return self.pid << 24

    @property
    def gtid(self) -> int:
        return self.gpid | self.pid

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr


RT = {"launch": "cudaLaunchKernel_v7000", "graph": "cudaGraphLaunch_v10000", "copy": "cudaMemcpyAsync_v3020",
      "ssync": "cudaStreamSynchronize_v3020", "esync": "cudaEventSynchronize_v3020",
      "record": "cudaEventRecord_v3020", "wait": "cudaStreamWaitEvent_v3020"}


class Engine:
    """Runs a schedule on a shape; ``truth`` holds one dict per (step, rank)."""

    def __init__(self, shape: Shape, costs: Costs, schedule: Schedule, rng: np.random.Generator, t0_ns: int):
        self.s, self.c, self.sched, self.rng = shape, costs, schedule, rng
        self.rows = Rows()
        self.procs = [Proc(r, 31000 + 17 * r, float(t0_ns), float(t0_ns)) for r in range(shape.n_ranks)]
        self.truth: list[dict] = []
        self.batch = int(rng.integers(24, int(shape.max_capture * 0.6)))
        self.graph_ids: dict[int, int] = {}

    # ---- helpers -------------------------------------------------------------------------
    def _api(self, p: Proc, name: str, t: float, dur: float, corr: int | None = None, gtid: int | None = None) -> float:
        self.rows.runtime.append((int(t), int(t + dur), gtid or p.gtid, corr if corr is not None else p.next_corr(),
                                  self.rows.sid(RT[name])))
        return t + dur

    def _copy(self, p: Proc, t: float, nbytes: int, kind: int, stream: int, gpu_ready: float,
              gtid: int | None = None) -> tuple[float, float]:
        """cudaMemcpyAsync at CPU time t; returns (API end, copy end on the GPU)."""
        corr = p.next_corr()
        api_end = self._api(p, "copy", t, 3e3, corr, gtid)
        start = max(gpu_ready, t + 2e3)
        end = start + 1.5e3 + nbytes / 20.0  # ~20 GB/s pinned PCIe: 20 bytes per ns
        src, dst = (PINNED, DEVICE) if kind == HTOD else (DEVICE, PINNED)
        self.rows.memcpy.append((int(start), int(end), p.rank, stream, corr, p.gpid, int(nbytes), kind, src, dst))
        return api_end, end

    def _graph_id(self, key: int) -> int:
        return self.graph_ids.setdefault(key, 100 + len(self.graph_ids))

    # ---- one step ------------------------------------------------------------------------
    def step(self, n: int) -> None:
        s, c, rng = self.s, self.c, self.rng
        eps = self.sched.at(n)
        by = {e.cause: e for e in eps}
        self.batch = int(np.clip(self.batch + rng.integers(-3, 4), 8, int(s.max_capture * 0.8)))
        rows = [max(1, self.batch + (int(rng.integers(-3, 4)) if r else 0)) for r in range(s.n_ranks)]
        fb = by.get("graph_fallback")
        if fb:  # a decode batch above the largest captured size (CudagraphDispatcher: no FULL key -> eager)
            rows = [s.max_capture + 1 + int(rng.integers(0, s.max_capture // 4)) for _ in rows]
        mix = by.get("mixing")
        prefill = [0] * s.n_ranks
        if mix:
            chunk = int(mix.magnitude * rng.uniform(0.85, 1.15))
            for r in range(s.n_ranks):
                if mix.rank in (-1, r) or s.n_ranks == 1:
                    prefill[r] = chunk
        mode = "FULL"
        if any(prefill):  # DP ranks share one graph mode (vLLM coordinate_batch_across_dp)
            mode = "PIECEWISE" if s.engine == "vllm" else "NONE"   # SGLang: extend/mixed runs eager
        elif max(rows) > s.max_capture:
            mode = "NONE"
        graph_ok = mode == "FULL"
        ops = [step_ops(s, c, rows[r], prefill[r], graph_ok) for r in range(s.n_ranks)]
        base = [step_ops(s, c, rows[r], 0, True) for r in range(s.n_ranks)]
        jit = rng.lognormal(0.0, c.jitter, size=(s.n_ranks, len(ops[0])))
        dur = np.array([[d for _, d, _ in o] for o in ops]) * jit
        healthy_gpu = (np.array([[d for _, d, _ in o] for o in base]).sum(axis=1) * jit.mean(axis=1)
                       + sum(k == "comm" for _, _, k in base[0]) * c.comm_ns)
        ep = by.get("ep_hotspot")
        if ep:
            kinds = np.array([k for _, _, k in ops[ep.rank]])
            dur[ep.rank, kinds == "exp"] *= ep.magnitude
        pd = by.get("pd_transfer")
        layer_wait = [[0.0] * s.layers for _ in range(s.n_ranks)]
        if pd and s.pd == "nixl":  # RDMA writes into HBM: the memory-bound kernels slow down, nothing else shows
            dur *= pd.magnitude
        stall = by.get("host_stall")
        # -- CPU pass ------------------------------------------------------------------------
        api_end = np.zeros_like(dur)
        ginfo: list[list[tuple[int, int, int] | None]] = []   # per rank, per op: (corr, graphId, nodeId)
        cpu_start, first_gpu, t_after = [], [], []
        for r, p in enumerate(self.procs):
            t = p.cpu
            cpu_start.append(t)
            if stall and stall.rank in (-1, r):
                t += stall.magnitude * 1e6 * rng.uniform(0.7, 1.3)
            nv0 = t
            t += c.sched_ns * rng.uniform(0.8, 1.2)
            gready = p.gpu
            gfirst = None
            n_tok = rows[r] + prefill[r]
            reqs = rows[r] + (1 if prefill[r] else 0)   # the chunked prompt is one more request
            if s.inputs_on_gpu:
                # SGLang schedule_batch.py: decode inputs stay on the device (input_ids = output_ids,
                # seq_lens.add_(1)); prepare_for_extend builds the new prompt's tensors on the CPU and
                # moves them with .to(device, non_blocking=True)
                copies = ([("input_ids", 8 * prefill[r]), ("seq_lens", 8 * reqs), ("req_pool_indices", 8 * reqs)]
                          if prefill[r] else [])
            else:
                # vLLM gpu_model_runner._prepare_inputs: input_ids / positions copy_to_gpu(num_tokens);
                # query_start_loc and seq_lens are padded and copied whole (copy_to_gpu() without n:
                # max_num_seqs (+1) int32, the same size every step); slot_mapping per token
                copies = [("input_ids", 4 * n_tok), ("positions", 8 * n_tok), ("query_start_loc", 4 * (MAX_SEQS + 1)),
                          ("seq_lens", 4 * MAX_SEQS), ("slot_mapping", 8 * n_tok)]
            for _, nb in copies:   # vLLM gpu_model_runner._prepare_inputs: CPU buffers -> copy_to_gpu
                gfirst = gfirst if gfirst is not None else max(gready, t + 2e3)   # the copy's start
                t, gready = self._copy(p, t, nb, HTOD, COMPUTE_STREAM, gready)
            if pd and s.pd == "copy":   # connector thread: layer-wise KV loads on its own stream
                # layer l's KV lands at (l + 1) x per_layer: the last layer waits until ~magnitude x
                # the healthy step, so the step stretches by the drawn factor
                per_layer = pd.magnitude * healthy_gpu[r] / s.layers
                side = max(p.side, t)
                ct = t
                for layer in range(s.layers):
                    nb = int(per_layer * 20.0)
                    ct, side = self._copy(p, ct, nb, HTOD, KV_STREAM, side, gtid=p.gpid | (p.pid + 3))
                    layer_wait[r][layer] = side
                p.side = side
            lc = c.launch_ns
            if fb and mode == "NONE":   # launch-bound eager decode: the CPU issues kernels slower than they run
                lc = max(lc, fb.magnitude * healthy_gpu[r] / len(ops[r]))
            gi: list[tuple[int, int, int] | None] = []
            piece = None
            node = 0
            layer = -1
            for i, (name, _, kind) in enumerate(ops[r]):
                if kind == "attn" and (i == 0 or ops[r][i - 1][2] != "attn"):
                    layer += 1
                    if pd and s.pd == "copy":  # wait_for_layer_load: the compute stream waits on the layer's event
                        t = self._api(p, "wait", t, 2e3)
                eager = (mode == "NONE" or kind == "samp" or
                         (mode == "PIECEWISE" and kind in ("attn", "comm")))
                if eager:
                    corr = p.next_corr()
                    t = self._api(p, "launch", t, lc, corr)
                    api_end[r, i] = t
                    gi.append((corr, 0, 0))
                    piece = None
                    continue
                if piece is None:   # a graph launch covers every op up to the next eager one
                    corr = p.next_corr()
                    gid = self._graph_id(rows[r] if mode == "FULL" else 10_000 + i)
                    t = self._api(p, "graph", t, c.graph_launch_ns, corr)
                    piece = (corr, gid, t)
                node += 1
                api_end[r, i] = piece[2]
                gi.append((piece[0], piece[1], node))
            ginfo.append(gi)
            first_gpu.append(gfirst if gfirst is not None else np.inf)
            t_after.append((t, nv0))
            p.gpu = gready
        # -- GPU pass (ranks together) --------------------------------------------------------
        kinds = [k for _, _, k in ops[0]]
        gpu = np.array([p.gpu for p in self.procs])
        starts, ends = np.zeros_like(dur), np.zeros_like(dur)
        attn_i = -1
        for i, kind in enumerate(kinds):
            ready = np.maximum(gpu, api_end[:, i])
            if kind == "attn" and (i == 0 or kinds[i - 1] != "attn"):
                attn_i += 1
                ready = np.maximum(ready, [layer_wait[r][attn_i] for r in range(s.n_ranks)])
            starts[:, i] = ready
            if kind == "comm":   # the all-to-all ends when the last rank has arrived
                gpu = np.full_like(gpu, ready.max() + c.comm_ns * rng.uniform(0.9, 1.1))
            else:
                gpu = ready + dur[:, i]
            ends[:, i] = gpu
        self._emit_kernels(ops, starts, ends, kinds, ginfo)
        # -- sampled ids back, the engine thread's wait -----------------------------------------
        for r, p in enumerate(self.procs):
            t, nv0 = t_after[r]
            g_end = float(gpu[r])
            if s.lag == 0:   # sync scheduling: D2H on the compute stream, then block until it lands
                t, d2h = self._copy(p, t, 8 * (rows[r] + (1 if prefill[r] else 0)), DTOH, COMPUTE_STREAM, g_end)
                t = self._api(p, "ssync", t, max(d2h - t, 0) + 4e3)
                out_end = d2h
            else:            # async / overlap: copy stream + event; wait for the previous step's ids
                t = self._api(p, "record", t, 2e3)
                t, out_end = self._copy(p, t, 8 * (rows[r] + (1 if prefill[r] else 0)), DTOH, OUTPUT_STREAM, g_end)
                t = self._api(p, "esync", t, max(p.out_prev - t, 0) + 3e3)
                p.out_prev = out_end
            p.cpu = t + c.post_ns * rng.uniform(0.8, 1.2)
            p.gpu = g_end if s.lag else out_end
            if s.nvtx:
                self.rows.nvtx.append((int(nv0), int(p.cpu), s.nvtx_step, p.gtid))
            self.truth.append({
                "step": n, "rank": r, "pid": p.pid, "device": r,
                "t_start_ns": int(min(first_gpu[r], starts[r, 0])), "t_end_ns": int(max(out_end, g_end)),
                "cpu_start_ns": int(cpu_start[r]), "decode_rows": rows[r], "prefill_tokens": prefill[r],
                "graph_mode": mode, "healthy_ns": int(healthy_gpu[r] + (c.sched_ns + c.post_ns if s.lag == 0 else 0)),
                "causes": ";".join(sorted(by)),
                "mixing_tokens": prefill[r], "ep_factor": ep.magnitude if ep else 0.0,
                "hot_rank": ep.rank if ep else -1, "pd_factor": pd.magnitude if pd else 0.0,
                "eager_factor": fb.magnitude if fb else 0.0,
                "host_stall_ns": int(stall.magnitude * 1e6) if stall and stall.rank in (-1, r) else 0,
                "cause_rank": ";".join(f"{e.cause}:{e.rank}" for e in eps)})

    def _emit_kernels(self, ops, starts, ends, kinds, ginfo) -> None:
        s, rows = self.s, self.rows
        for r, p in enumerate(self.procs):
            graph_spans: dict[int, list] = {}
            for i, (name, _, kind) in enumerate(ops[r]):
                corr, gid, node = ginfo[r][i]
                st, en = starts[r, i], ends[r, i]
                # SM share while resident: a waiting all-to-all keeps only its own CTAs on SMs
                share = COMM_SM.get(s.a2a, 0.15) if kind == "comm" else self.c.fill * (0.7 if kind == "attn" else 1.0)
                rows.busy.setdefault(r, []).append((st, en, share))
                if gid and s.graph_trace == "graph":   # graph-level trace: one row per replay, no nodes
                    span = graph_spans.setdefault(corr, [st, en, gid])
                    span[0], span[1] = min(span[0], st), max(span[1], en)
                    continue
                short, dem = NAMES[name]
                rows.kernels.append((int(st), int(en), p.rank, COMPUTE_STREAM, corr, p.gpid, rows.sid(short),
                                     rows.sid(dem), gid or None, (gid * 1000 + node) if gid else None))
            for corr, (st, en, gid) in graph_spans.items():
                rows.graphs.append((int(st), int(en), p.rank, COMPUTE_STREAM, corr, p.gpid, gid, gid + 5000))
