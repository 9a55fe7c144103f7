"""Turn a step plan into CPU/GPU activity per rank: runtime calls, kernels, graphs, copies, syncs, NVTX.

The rules are the CUDA stream semantics every engine obeys: a kernel/copy starts no earlier than its
launch call and no earlier than the previous op on its stream ends; a graph replay runs its nodes in
order under one ``cudaGraphLaunch`` correlation id (formats.md §3.6); a sync call returns when the
awaited op ends. Ranks meet in every all-to-all: a dispatch/combine kernel ends when the last rank
has arrived plus the transfer time, so the waiting rank's kernel is the long one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .engines import ROLE_WEIGHT, CostModel, EngineSpec, graph_mode, layer_kernels, padded
from .planner import StepPlan

US = 1_000
MS = 1_000_000
COMPUTE, COPY_OUT, KV_STREAM = 7, 13, 21


@dataclass
class Trace:
    """Rows as plain tuples (fast to build and to ``executemany``); times in ns."""

    t0: int
    pids: list[int]
    kernels: list = field(default_factory=list)   # start,end,dev,stream,corr,pid,name,graphId,nodeId
    graphs: list = field(default_factory=list)    # start,end,dev,stream,corr,pid,graphId,execId
    copies: list = field(default_factory=list)    # start,end,dev,stream,corr,pid,bytes,kind,srcK,dstK,srcDev,dstDev
    runtime: list = field(default_factory=list)   # start,end,pid,tid,corr,name
    syncs: list = field(default_factory=list)     # start,end,dev,stream,corr,pid,syncType
    nvtx: list = field(default_factory=list)      # start,end,pid,tid,text
    sm_work: list = field(default_factory=list)   # start,end,dev,SM share: every kernel, graph nodes included
    truth: list = field(default_factory=list)     # dicts, one per (step, rank)


class _Rank:
    def __init__(self, r: int, pid: int, t0: int):
        self.r, self.pid, self.tid, self.conn_tid = r, pid, pid, pid + 7
        self.cpu = t0
        self.gpu = t0          # compute stream free at
        self.corr = 1000       # per-process counters: ids collide across processes, as in real exports
        self.d2h_end = 0

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr


class Simulator:
    """Builds a :class:`Trace` step by step; ``graph_trace`` is ``graph`` or ``node``."""

    def __init__(self, spec: EngineSpec, cost: CostModel, rng: np.random.Generator, graph_trace: str, nvtx: bool):
        self.spec, self.cost, self.rng, self.graph_trace, self.nvtx = spec, cost, rng, graph_trace, nvtx
        t0 = int(rng.integers(20, 200)) * 1_000_000_000  # nsys time is not zero-based
        pids = [int(rng.integers(2000, 60000)) for _ in range(spec.n_ranks)]
        self.trace = Trace(t0=t0, pids=pids)
        self.ranks = [_Rank(r, p, t0) for r, p in enumerate(pids)]
        # share of the GPU's SMs an all-to-all kernel occupies, per kernel name (set by simulate()
        # from its own generator; compute kernels occupy 1.0, scaled by the writer's fill factor)
        self.comm_sm: dict[str, float] = {}
        self.track_sm = False  # only when GPU metrics are written: one tuple per kernel (2 M at scale)

    def _sm(self, dev: int, start: int, end: int, name: str) -> None:
        if self.track_sm:
            self.trace.sm_work.append((start, end, dev, self.comm_sm.get(name, 1.0)))

    # -- primitives ----------------------------------------------------------------------------
    def _api(self, rk: _Rank, name: str, dur_ns: int, tid=None) -> tuple[int, int, int]:
        corr = rk.next_corr()
        s = rk.cpu
        rk.cpu = s + dur_ns
        self.trace.runtime.append((s, s + dur_ns, rk.pid, tid or rk.tid, corr, name))
        return s, s + dur_ns, corr

    def _copy(self, rk: _Rank, nbytes: int, kind: int, stream: int, after: int, gbps: float) -> int:
        _, e, corr = self._api(rk, "cudaMemcpyAsync_v3020", int(self.rng.uniform(3, 6) * US))
        start = max(e - US, after)
        end = start + int(1.5 * US + nbytes / gbps)
        src, dst = (1, 2) if kind == 1 else (2, 1)
        self.trace.copies.append((start, end, rk.r, stream, corr, rk.pid, nbytes, kind, src, dst, rk.r, rk.r))
        return end

    def _sync(self, rk: _Rank, until: int, stream: int) -> None:
        if self.spec.sync_api == "cudaEventSynchronize":
            self._api(rk, "cudaEventRecord_v3020", 2 * US)
        s, _, corr = self._api(rk, self.spec.sync_api + "_v3020", 2 * US)
        end = max(rk.cpu, until + 3 * US)
        rk.cpu = end
        self.trace.runtime[-1] = self.trace.runtime[-1][:1] + (end,) + self.trace.runtime[-1][2:]
        sync_type = 1 if self.spec.sync_api == "cudaEventSynchronize" else 3
        self.trace.syncs.append((s, end, rk.r, stream, corr, rk.pid, sync_type))

    # -- one step ------------------------------------------------------------------------------
    def _durations(self, p: StepPlan, mode: str, r: int, kernels) -> list[int]:
        c = self.cost
        rows = p.decode_rows[r]
        tokens = p.prefill_tokens if r == 0 else 0
        eff_rows = padded(c, rows + tokens) if mode == "FULL" else rows
        t_ms = c.base_ms + c.per_row_us * eff_rows / 1e3 + c.per_token_us * p.prefill_tokens / 1e3
        t_ms *= float(self.rng.lognormal(0.0, c.jitter)) * (1.0 if mode == "FULL" else c.eager_mult)
        if p.pd_bytes:
            t_ms += c.transfer_stall * p.pd_bytes / (c.transfer_gbps * 1e6)
        weights = np.array([ROLE_WEIGHT[role] for _, role in kernels])
        durs = t_ms * MS * weights / weights.sum()
        if p.hot_rank == r:
            durs = durs * np.array([c.hot_factor if role == "expert" else 1.0 for _, role in kernels])
        return [max(int(d), 1500) for d in durs]

    def _units(self, kernels, mode: str, size: int) -> list[tuple[int | None, list[int]]]:
        """Group kernel indices into launches: ``(graph_id or None, [kernel idx])``."""
        idx = list(range(len(kernels)))
        size_key = self.cost.capture_sizes.index(size) if size in self.cost.capture_sizes else 0
        if mode == "FULL":
            return [(1000 + size_key, idx)]
        if mode == "NONE":
            return [(None, [i]) for i in idx]
        units, piece = [], []
        for i in idx:
            if kernels[i][1] in ("attn_p", "attn_d"):
                if piece:
                    units.append((5000 + 100 * size_key + len(units), piece))
                    piece = []
                units.append((None, [i]))
            else:
                piece.append(i)
        if piece:
            units.append((5000 + 100 * size_key + len(units), piece))
        return units

    def step(self, p: StepPlan) -> None:
        spec, c, rng, tr = self.spec, self.cost, self.rng, self.trace
        tokens0 = p.prefill_tokens + p.decode_rows[0]
        mode = graph_mode(spec, c, p.prefill_tokens, max(p.decode_rows))  # DP ranks agree on one mode
        if p.prefill_tokens == 0 and max(p.decode_rows) > c.max_capture:
            mode = "NONE"
        size = padded(c, max(tokens0, max(p.decode_rows)))
        info = []
        for rk in self.ranks:
            stall = int(p.host_stall_ms * MS)
            start = rk.cpu
            rk.cpu += int(c.host_gap_ms * MS * rng.uniform(0.8, 1.25))
            if stall:  # the stall is counted from when the GPU runs dry, so it is the idle time it causes
                rk.cpu = max(rk.cpu, rk.gpu, rk.d2h_end) + stall
            info.append({"cpu_start": start, "prep": rk.cpu})
        # input copies (per scheduled token, per request)
        for rk, inf in zip(self.ranks, info):
            pt = p.prefill_tokens if rk.r == 0 else 0
            rows = p.decode_rows[rk.r]
            reqs = rows + (1 if pt else 0)
            toks = rows + pt
            inf.update(tokens=toks, reqs=reqs, h2d=0, gpu_start=None, kv=0)
            if p.pd_bytes and rk.r == 0:
                inf["kv"] = self._kv_transfer(rk, p.pd_bytes)
            for name, b in spec.token_copies:
                end = self._copy(rk, b * toks, 1, COMPUTE, rk.gpu, c.h2d_gbps)
                inf["gpu_start"] = inf["gpu_start"] or tr.copies[-1][0]
                inf["h2d"] += b * toks
                rk.gpu = end
            for i, (name, b) in enumerate(spec.request_copies):
                n = b * (reqs + (1 if i == 0 else 0))
                rk.gpu = self._copy(rk, n, 1, COMPUTE, rk.gpu, c.h2d_gbps)
                inf["h2d"] += n
            inf["fwd_cpu"] = rk.cpu
        # forward: each rank runs its own batch's kernels (a DP-attention rank without the prefill
        # runs decode attention while rank 0 runs prefill attention); ranks share the graph mode and
        # the layer structure, so they meet in the same sequence of all-to-all collectives
        per_rank = [[(self._ep_name(n, mode), role)
                     for n, role in layer_kernels(spec, p.prefill_tokens if r == 0 else 0, p.decode_rows[r])]
                    * c.n_layers for r in range(spec.n_ranks)]
        durs = [self._durations(p, mode, r, per_rank[r]) for r in range(spec.n_ranks)]
        plan = []  # per rank: (graph id, kernel index, launch end, correlation, unit, node) in launch order
        for rk, inf in zip(self.ranks, info):
            inf.update(graphs=0, launches=0)
            seq = []
            for u, (gid, members) in enumerate(self._units(per_rank[rk.r], mode, size)):
                rk.cpu += int(rng.uniform(8, 20) * US) if gid is None else int(rng.uniform(20, 40) * US)
                name = "cudaLaunchKernel_v7000" if gid is None else "cudaGraphLaunch_v10000"
                _, e, corr = self._api(rk, name, int(c.launch_us * (1 if gid is None else 2.5) * US))
                inf["graphs" if gid is not None else "launches"] += 1
                seq += [(gid, k, e, corr, u, node) for node, k in enumerate(members)]
            plan.append(seq)
        self._run_gpu(plan, per_rank, durs)
        # sampler, sampled-id D2H, sync
        for rk, inf in zip(self.ranks, info):
            for k in spec.sampler:
                _, e, corr = self._api(rk, "cudaLaunchKernel_v7000", int(c.launch_us * US))
                s = max(rk.gpu, e - US)
                rk.gpu = s + int(rng.uniform(20, 60) * US)
                tr.kernels.append((s, rk.gpu, rk.r, COMPUTE, corr, rk.pid, k, None, None))
                self._sm(rk.r, s, rk.gpu, k)
                inf["launches"] += 1
            inf["d2h"] = spec.sampled_bytes * inf["reqs"]
            stream = COPY_OUT if spec.overlap else COMPUTE
            prev_d2h = rk.d2h_end
            rk.d2h_end = self._copy(rk, inf["d2h"], 2, stream, rk.gpu, c.h2d_gbps)
            if stream == COMPUTE:
                rk.gpu = rk.d2h_end
            inf["gpu_end"] = rk.d2h_end
            if spec.overlap:  # resolve the previous batch while this one runs
                if p.step > 0:
                    self._sync(rk, prev_d2h, COPY_OUT)
            else:
                self._sync(rk, rk.d2h_end, COMPUTE)
            if self.nvtx:
                tr.nvtx.append((inf["prep"], rk.cpu, rk.pid, rk.tid, spec.nvtx_step))
                tr.nvtx.append((inf["fwd_cpu"], rk.cpu if not spec.overlap else inf["fwd_cpu"] + 1,
                                rk.pid, rk.tid, spec.nvtx_forward))
            rk.cpu += int(rng.uniform(0.2, 0.8) * MS)  # output processing
            pt = p.prefill_tokens if rk.r == 0 else 0
            rows = p.decode_rows[rk.r]
            tr.truth.append(dict(
                step=p.step, rank=rk.r, pid=rk.pid, device=rk.r, t_start_ns=inf["gpu_start"], t_end_ns=inf["gpu_end"],
                cpu_start_ns=inf["cpu_start"], kind="mixed" if pt and rows else ("prefill" if pt else "decode"),
                prefill_tokens=pt, decode_rows=rows, waiting_decodes=p.waiting_decodes, graph_mode=mode,
                cause=p.cause, hot_rank=p.hot_rank, graph_launches=inf["graphs"], kernel_launches=inf["launches"],
                h2d_bytes=inf["h2d"], d2h_bytes=inf["d2h"], sampled_rows=inf["reqs"], kv_transfer_bytes=inf["kv"],
                host_stall_ns=int(p.host_stall_ms * MS)))

    def _run_gpu(self, plan, per_rank, durs) -> None:
        """Run every rank's launched kernels on its compute stream; at each collective the ranks
        wait for each other (a dispatch/combine ends when the last rank arrived plus the transfer)."""
        c, tr = self.cost, self.trace
        pos = [0] * len(self.ranks)
        units: list[dict] = [{} for _ in self.ranks]  # unit -> [first start, last end, gid, corr]

        def emit(rk, item, start, end):
            gid, k, _, corr, u, node = item
            if gid is None or self.graph_trace == "node":
                tr.kernels.append((start, end, rk.r, COMPUTE, corr, rk.pid, per_rank[rk.r][k][0], gid,
                                   None if gid is None else gid * 1000 + node))
            self._sm(rk.r, start, end, per_rank[rk.r][k][0])
            units[rk.r].setdefault(u, [start, end, gid, corr])[1] = end
            rk.gpu = end
            pos[rk.r] += 1

        while any(pos[rk.r] < len(plan[rk.r]) for rk in self.ranks):
            waiting = []
            for rk in self.ranks:
                while pos[rk.r] < len(plan[rk.r]):
                    item = plan[rk.r][pos[rk.r]]
                    start = max(rk.gpu, item[2] - US)
                    if per_rank[rk.r][item[1]][1] in ("dispatch", "combine"):
                        waiting.append((rk, item, start))
                        break
                    emit(rk, item, start, start + max(durs[rk.r][item[1]], 1500))
            if waiting:
                meet = max(start for _, _, start in waiting)
                for rk, item, start in waiting:
                    emit(rk, item, start, max(meet + int(c.comm_ms * MS / 2), start + 1500))
        if self.graph_trace == "graph":
            for rk in self.ranks:
                for first, last, gid, corr in units[rk.r].values():
                    if gid is not None:
                        tr.graphs.append((first, last, rk.r, COMPUTE, corr, rk.pid, gid, gid))

    def _ep_name(self, name: str, mode: str) -> str:
        pair = self.spec.ep_decode if mode == "FULL" else self.spec.ep_prefill
        return {"EP_DISPATCH": pair[0], "EP_COMBINE": pair[1]}.get(name, name)

    def _kv_transfer(self, rk: _Rank, nbytes: int) -> int:
        """KV for a new request arrives on a connector stream, layer by layer, starting before the step."""
        c, tr = self.cost, self.trace
        total_ns = int(nbytes / (c.transfer_gbps * 1e9) * 1e9)
        at = rk.cpu - int(total_ns * self.rng.uniform(0.1, 0.6))
        chunk = nbytes // c.n_layers
        for i in range(c.n_layers):
            corr = rk.next_corr()
            name = "cudaLaunchKernelExC_v11060" if c.transfer == "nccl" else "cudaMemcpyAsync_v3020"
            tr.runtime.append((at, at + 5 * US, rk.pid, rk.conn_tid, corr, name))
            end = at + 2 * US + int(chunk / c.transfer_gbps)
            if c.transfer == "nccl":
                tr.kernels.append((at + 2 * US, end, rk.r, KV_STREAM, corr, rk.pid, "ncclDevKernel_SendRecv", None, None))
                self._sm(rk.r, at + 2 * US, end, "ncclDevKernel_SendRecv")
            else:
                kind, src_dev = (1, rk.r) if c.transfer == "h2d" else (10, rk.r + 4)
                tr.copies.append((at + 2 * US, end, rk.r, KV_STREAM, corr, rk.pid, chunk, kind,
                                  1 if kind == 1 else 2, 2, src_dev, rk.r))
            at = end
        return chunk * c.n_layers

    def finish(self) -> Trace:
        """Close the overlap pipeline (the last batch is resolved) and return the trace."""
        if self.spec.overlap:
            for rk in self.ranks:
                self._sync(rk, rk.d2h_end, COPY_OUT)
        return self.trace
