"""Small Nsight exports of the step shapes real engines leave in a trace, with per-step truth by construction.

Each :class:`Shape` fixes what one engine configuration does per step - which input copies it issues,
whether and how it copies the sampled ids back and who waits for them, whether the host runs ahead of
the GPU, which attention / collective kernels run, where CUDA graphs replay - and names the engine
source it follows (``basis``). :func:`build` writes an export with the real 3.25 DDL
(:mod:`tests.helpers.nsys_export`) from a plan of decode / mixed / prefill steps drawn from a seed and
returns the truth: per step its kind, prompt tokens, decode rows and GPU window (first to last GPU item
of the step, the reader's own definition). Nothing here imports mixdiag.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import json

import numpy as np
import pandas as pd

from .nsys_export import NsysExport, gtid

US = 1_000
T0 = 11_000_000_000          # trace clock (ns); the export's session starts at 10 s on it
UTC0_S = 1_700_000_000.0     # NsysExport's session utcEpochNs, in seconds
PID = 4242
MAIN, OUTPUT = gtid(PID, PID), gtid(PID, PID + 1)
COMPUTE, COPY_STREAM = 7, 13
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
TABLES = NsysExport.CORE + ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")


def fa2_splitkv(prompt: bool) -> list[tuple[str, str]]:
    """FlashAttention-2 with a block table: ``mha_varlen_fwd`` always runs the split-KV kernel
    (``run_mha_fwd(params, stream, paged_KV)``); ``Is_causal`` is false only when max_seqlen_q == 1."""
    causal = "true" if prompt else "false"
    return [(f"void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
             f"cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t>>, {causal}, false, "
             f"false, false, true, false, false, false>(flash::Flash_fwd_params)", "flash_fwd_splitkv_kernel")]


def fa2_splitkv_spec(prompt: bool) -> list[tuple[str, str]]:
    """FA2 paged under speculative decoding: every decode request carries k + 1 verification rows, so
    max_seqlen_q > 1 in every step and ``Is_causal`` stays true whether a prompt rides along or not."""
    return fa2_splitkv(True)


def fa3(prompt: bool) -> list[tuple[str, str]]:
    """FlashAttention-3 (hopper/): one persistent cutlass kernel for every phase."""
    return [("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
             "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>, "
             "cute::tuple<cute::C<128>, cute::C<112>, cute::C<128>>, 128, cutlass::bfloat16_t, float, "
             "cutlass::arch::Sm90, false, false, false, true, true, false, true, true, false, false, false>, "
             "flash::CollectiveEpilogueFwd<cute::tuple<cute::C<128>, cute::C<128>, cute::C<112>>, "
             "cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>, cutlass::bfloat16_t, cutlass::arch::Sm90, 256, true, "
             "false, true, false>, flash::VarlenDynamicPersistentTileScheduler<128, 256, 128, false, true, true>>>>"
             "(flash::FlashAttnFwdSm90<...>::Params)", "device_kernel")]


def flashinfer_split(prompt: bool, decode: bool = True) -> list[tuple[str, str]]:
    """vLLM's FlashInfer backend: the decode wrapper on the decode rows, the prefill wrapper on the rest."""
    out = []
    if decode:
        out.append(("void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>(...)", "BatchDecodeWithPagedKVCacheKernel"))
    if prompt:
        out.append(("void flashinfer::BatchPrefillWithPagedKVCacheKernel<...>(...)", "BatchPrefillWithPagedKVCacheKernel"))
    return out


def flashinfer_sglang(prompt: bool) -> list[tuple[str, str]]:
    """SGLang: a MIXED batch runs the extend path (prefill kernel only), decode the decode kernel."""
    return flashinfer_split(prompt, decode=not prompt)


@dataclass(frozen=True)
class Shape:
    """What one engine configuration does per step (see the module docstring)."""

    name: str
    basis: str
    attention: object                     # (prompt: bool) -> [(demangled, short)] per layer
    token_copies: tuple[int, ...]         # H2D bytes per scheduled token, one copy each
    request_copies: tuple[int, ...]       # H2D bytes per request, one copy each (+1 row for offsets: first)
    prompt_copies_only: bool              # inputs stay on the GPU: H2D only on steps with prompt tokens
    sampled_bytes: int | None             # D2H bytes per sampled request; None: this process samples nothing
    d2h_stream: int
    wait: str                             # main | output-thread | next-launch | none
    host_ahead: bool                      # the CPU prepares step n+1 while the GPU runs step n
    decode_graph: bool                    # decode replays one FULL graph (graph-level trace)
    mixing: bool                          # prompt chunks ride with the decodes (else prefill-only steps)
    steady: bool = False                  # fixed concurrency: the batch size never drifts
    per_layer: tuple[str, ...] = ()       # extra kernels per layer (collectives); prompt steps may differ
    per_layer_prompt: tuple[str, ...] | None = None
    layers: int = 4
    padded_copies: tuple[int, ...] = ()   # H2D bytes copied whole every step (buffers padded to max_num_seqs)
    spec_tokens: int = 0                  # draft tokens per decode request (verification rows: k + 1 each)

    def __post_init__(self):
        if self.wait not in ("main", "output-thread", "next-launch", "none"):
            raise ValueError(f"wait must be main|output-thread|next-launch|none, not {self.wait!r}")


def plan(seed: int, n_steps: int, mixing: bool, steady: bool = False) -> pd.DataFrame:
    """Decode steps with a prompt chunk every 5-9 steps; the running batch drifts (>= 5 distinct sizes),
    or with ``steady`` stays fixed (a fixed-concurrency benchmark: one request ends as one starts)."""
    rng = np.random.default_rng(seed)
    rows, running, nxt = [], int(rng.integers(10, 30)), int(rng.integers(3, 6))
    for i in range(n_steps):
        if i == nxt:
            tokens = int(rng.integers(200, 2048))
            if mixing:
                rows.append(("mixed", tokens, running, running + 1))
            else:
                prompts = int(rng.integers(1, 3))
                rows.append(("prefill", tokens, 0, prompts))
            nxt += int(rng.integers(5, 10))
            running += 0 if steady else 1
        else:
            rows.append(("decode", 0, running, running))
            if not steady:
                running = max(4, running + int(rng.integers(-2, 3)))
    out = pd.DataFrame(rows, columns=["kind", "prefill_tokens", "decode_rows", "sampled_reqs"])
    # host stalls (GC, detokenizer, scheduler hiccups): 20-80 ms without any call, before ~1 step in 20
    out["host_stall_us"] = np.where(rng.random(n_steps) < 0.05, rng.integers(20_000, 80_000, n_steps), 0)
    return out


class KinetoSink:
    """The same rows as Chrome-trace JSON the way ``torch.profiler`` writes it (format as in
    tests/helpers/foreign_trace/kineto_writer.py: ``ts``/``dur`` in µs from ``baseTimeNanoseconds``, GPU
    rows on ``pid`` = device / ``tid`` = stream, ``args.correlation``). Kineto has no graph-level rows: a
    replay shows its nodes under the ``cudaGraphLaunch`` correlation, here one node kernel per replay."""

    COPY = {1: "Memcpy HtoD (Pinned -> Device)", 2: "Memcpy DtoH (Device -> Pinned)"}

    def __init__(self, path: Path):
        self.path, self.base, self.ev = Path(path), T0 - 10_000_000, []

    def _us(self, t: int) -> float:
        return round((t - self.base) / 1000.0, 3)

    def _x(self, cat, name, pid, tid, s, e, **args):
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": self._us(s),
                        "dur": round((e - s) / 1000.0, 3), "args": args})

    def call(self, s, e, name, corr, tid):
        self._x("cuda_runtime", name.rsplit("_v", 1)[0], PID, tid & 0xFFFFFF, s, e, correlation=corr)

    def kernel(self, s, e, corr, pid, *, name, short=None, stream=COMPUTE):
        self._x("kernel", name, 0, stream, s, e, correlation=corr, device=0, stream=stream)

    def copy(self, s, e, corr, pid, nbytes, kind, *, stream=COMPUTE):
        self._x("gpu_memcpy", self.COPY[kind], 0, stream, s, e, correlation=corr, device=0, stream=stream, bytes=nbytes)

    def graph_trace(self, s, e, corr, pid, *, stream=COMPUTE):
        self.kernel(s, e, corr, pid, name=GEMM, stream=stream)

    def close(self) -> Path:
        doc = {"schemaVersion": 1, "baseTimeNanoseconds": self.base, "traceEvents": self.ev,
               "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}]}
        self.path.write_text(json.dumps(doc, separators=(",", ":")))
        return self.path

    @staticmethod
    def seconds(ns):
        return ns / 1e9          # unix = baseTimeNanoseconds + ts


class _Writer:
    def __init__(self, ex, rng: np.random.Generator):
        self.ex, self.corr, self.cpu, self.gpu = ex, 100, T0, {COMPUTE: T0, COPY_STREAM: T0}
        self.rng = rng
        self.first: int | None = None
        self.last = 0

    def call(self, name: str, dur: int, tid=MAIN, end: int | None = None) -> int:
        self.corr += 1
        s = self.cpu if tid == MAIN else end - dur
        e = s + dur if end is None else end
        self.ex.call(s, e, name, self.corr, tid)
        if tid == MAIN:
            # Python between two calls of one forward: a few µs, lognormal (torch dispatch, no sleep)
            self.cpu = e + int(self.rng.lognormal(np.log(3.0), 0.6) * US)
        return self.corr

    def _gpu(self, stream: int, dur: int, after: int = 0) -> tuple[int, int]:
        s = max(self.cpu, self.gpu[stream], after)
        self.gpu[stream] = s + dur
        self.first = s if self.first is None else min(self.first, s)
        self.last = max(self.last, s + dur)
        return s, s + dur

    def kernel(self, names: tuple[str, str], dur: int) -> None:
        corr = self.call("cudaLaunchKernel_v7000", 4 * US)
        s, e = self._gpu(COMPUTE, dur)
        self.ex.kernel(s, e, corr, PID, name=names[0], short=names[1], stream=COMPUTE)

    def graph(self, dur: int) -> None:
        corr = self.call("cudaGraphLaunch_v10000", 8 * US)
        s, e = self._gpu(COMPUTE, dur)
        self.ex.graph_trace(s, e, corr, PID, stream=COMPUTE)

    def copy(self, nbytes: int, kind: int, stream: int) -> int:
        corr = self.call("cudaMemcpyAsync_v3020", 3 * US)
        after = self.gpu[COMPUTE] if stream != COMPUTE else 0    # a side stream waits for the forward
        s, e = self._gpu(stream, 2 * US + nbytes // 20, after)
        self.ex.copy(s, e, corr, PID, nbytes, kind, stream=stream)
        return e


def build(shape: Shape, path: Path, *, seed: int = 0, n_steps: int = 60, fmt: str = "nsys") -> tuple[Path, pd.DataFrame]:
    """Write ``shape``'s export (``fmt`` nsys: SQLite, kineto: JSON) to ``path``; returns it and the truth
    (one row per step)."""
    rng = np.random.default_rng(seed + 1)
    steps = plan(seed, n_steps, shape.mixing, shape.steady)
    ex = NsysExport(path, tables=TABLES) if fmt == "nsys" else KinetoSink(path)
    w = _Writer(ex, rng)
    windows, pending_wait = [], None
    for p in steps.itertuples(index=False):
        prompt = p.prefill_tokens > 0
        tokens, reqs = p.prefill_tokens + p.decode_rows * (1 + shape.spec_tokens), p.sampled_reqs
        # the host schedules between forwards (0.3-0.9 ms); a synchronous engine has waited for the GPU
        w.cpu += (int(rng.uniform(300, 900)) + int(p.host_stall_us)) * US
        w.first, w.last = None, 0
        if not shape.prompt_copies_only or prompt:
            for i, b in enumerate(shape.token_copies):
                w.copy(b * tokens, 1, COMPUTE)
            for i, b in enumerate(shape.request_copies):
                w.copy(b * (reqs + (1 if i == 0 else 0)), 1, COMPUTE)
            for b in shape.padded_copies:
                w.copy(b, 1, COMPUTE)
        step_us = 3000 + 12 * p.decode_rows + 2 * p.prefill_tokens      # GPU time of the forward
        kern_us = step_us // (shape.layers * 6)
        if not prompt and shape.decode_graph:
            w.graph(step_us * US)
        else:
            extra = shape.per_layer_prompt if (prompt and shape.per_layer_prompt is not None) else shape.per_layer
            for _ in range(shape.layers):
                w.cpu += int(rng.uniform(10, 100)) * US     # eager mode: module and op overhead per layer
                w.kernel(("rms_norm_kernel", "rms_norm_kernel"), kern_us // 4 * US)
                w.kernel((GEMM, GEMM), kern_us * US)
                for a in shape.attention(prompt):
                    w.kernel(a, kern_us * US)
                w.kernel((GEMM, GEMM), kern_us * US)
                for k in extra:
                    w.kernel((k, k), kern_us // 2 * US)
                w.kernel((GEMM, GEMM), 2 * kern_us * US)
        if shape.sampled_bytes:
            w.kernel(("argmax_kernel", "argmax_kernel"), 20 * US)
        else:  # a pipeline stage that does not sample hands its hidden states to the next stage
            w.kernel(("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_SendRecv"), 60 * US)
        if shape.sampled_bytes:
            d2h_end = w.copy(shape.sampled_bytes * reqs, 2, shape.d2h_stream)
            if shape.wait == "main":
                w.call("cudaStreamSynchronize_v3020", 2 * US, end=max(w.cpu + 2 * US, d2h_end + 3 * US))
            elif shape.wait in ("output-thread", "next-launch"):
                w.call("cudaEventRecord_v3020", 2 * US)
                if shape.wait == "output-thread":   # the output thread blocks from now until the copy lands
                    w.call("cudaEventSynchronize_v3020", max(d2h_end + 3 * US - w.cpu, 2 * US), tid=OUTPUT,
                           end=max(d2h_end + 3 * US, w.cpu + 2 * US))
                else:                                # overlap: wait for the previous batch after launching this one
                    if pending_wait is not None:
                        w.call("cudaEventSynchronize_v3020", 2 * US, end=max(w.cpu + 2 * US, pending_wait + 3 * US))
                    pending_wait = d2h_end
        if not shape.host_ahead:
            w.cpu = max(w.cpu, w.last)   # nothing launches until this step's results are back
        else:
            # at most one step in flight: the next launch waits until the GPU starts this one's last work
            w.cpu = max(w.cpu, w.last - step_us * US // 2)
        windows.append((w.first, w.last))
    ex.close()
    truth = steps.copy()
    truth["gpu_start_ns"], truth["gpu_end_ns"] = zip(*windows)
    truth["t_start_s"] = (UTC0_S + (truth["gpu_start_ns"] - 10_000_000_000) / 1e9 if fmt == "nsys"
                          else KinetoSink.seconds(truth["gpu_start_ns"]))
    return path, truth


@dataclass(frozen=True)
class Score:
    """How well a reconstruction found one fixture's steps (see :func:`score`)."""

    recall: float            # true step starts with a detected start within the tolerance
    precision: float         # detected starts that are some true start
    kind_accuracy: float     # true steps matched and given their true kind (``unknown`` counts as missed)
    wrong_claims: int        # matched steps given a kind other than ``unknown`` that is not the true one
    matched: np.ndarray      # per true step: row of ``steps`` (sorted by start) nearest to it


def score(steps: pd.DataFrame, truth: pd.DataFrame, tol_s: float = 50e-6) -> Score:
    """Compare a reconstruction's steps with the truth of :func:`build`."""
    order = np.argsort(steps["t_start_s"].to_numpy(), kind="stable")
    det = steps["t_start_s"].to_numpy()[order]
    tru = truth["t_start_s"].to_numpy()
    idx = np.searchsorted(det, tru)
    lo, hi = np.clip(idx - 1, 0, len(det) - 1), np.clip(idx, 0, len(det) - 1)
    near = np.where(np.abs(det[lo] - tru) <= np.abs(det[hi] - tru), lo, hi)
    hit = np.abs(det[near] - tru) <= tol_s
    kind = steps["kind"].to_numpy()[order][near]
    want = truth["kind"].to_numpy()
    return Score(recall=float(hit.mean()), precision=float(len(np.unique(near[hit])) / max(len(det), 1)),
                 kind_accuracy=float(np.mean(hit & (kind == want))),
                 wrong_claims=int(np.sum(hit & (kind != "unknown") & (kind != want))), matched=order[near])
