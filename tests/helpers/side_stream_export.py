"""A small vLLM-like Nsight export whose decode steps receive PD KV on a side stream while they run.

Engine behaviour modelled (and its source):

* decode steps replay one FULL CUDA graph per step (vLLM ``CudagraphDispatcher``, formats.md §1.3), launched
  inside an ``execute_model`` NVTX range (``record_function`` in profiled vLLM runs), after an H2D copy of the
  step inputs; the sampled ids come back by a D2H copy the engine thread waits for (``cudaStreamSynchronize``,
  vLLM V1 sync scheduling);
* KV for a request handed over by a prefill instance is loaded while a step runs: vLLM's KV connector API
  starts the load before the forward (``start_load_kv``) and blocks the attention on it
  (``wait_for_layer_load``); LMCache / P2pNccl copy on a CUDA stream of their own and the compute stream waits
  on an event recorded after the copy (``cudaStreamWaitEvent``) - vLLM ``vllm/distributed/kv_transfer/
  kv_connector/v1/base.py`` (KVConnectorBase_V1 docstrings). Here: a few large H2D copies of unequal size
  (KV blocks of different requests) on stream 21, issued by a connector thread (``issuer="connector"``) or by
  the engine thread itself (``issuer="engine"``), starting 1 ms into the step;
* ``wait=False``: the compute stream does not wait (the copy only overlaps the forward);
* ``rdma=True``: NIXL moves the KV by RDMA, no CUDA copy row exists (NIXL ``nixl_agent`` transfers; vLLM
  ``NixlConnector``): only the wait shows, as an idle compute stream after a ``cudaStreamWaitEvent``.

Rows are written with :class:`helpers.nsys_export.NsysExport` (the real 3.25 DDL). Times in ns.
"""
from __future__ import annotations

from dataclasses import dataclass

from helpers.nsys_export import NsysExport, gtid

PID, MAIN, CONN = 4242, 4242, 4300
MS, US = 1_000_000, 1_000
COMPUTE, KV_STREAM = 7, 21


@dataclass(frozen=True)
class SideStreamCase:
    n_steps: int = 60
    pd_steps: tuple[int, ...] = tuple(range(25, 41))
    copy_bytes: tuple[int, ...] = (24 << 20, 40 << 20)   # per PD step, copied back to back
    copy_ms: tuple[float, ...] = (2.5, 3.5)
    issuer: str = "connector"                            # connector | engine
    wait: bool = True                                    # the compute stream waits for the copies
    rdma: bool = False                                   # no CUDA copy rows (NIXL)
    graph_ms: float = 10.0


def write(path, case: SideStreamCase = SideStreamCase()):
    """Write the export; returns ``{step: (gpu_start_ns, gpu_end_ns)}`` as written."""
    ex = NsysExport(path, tables=NsysExport.CORE + ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"))
    main, conn = gtid(PID, MAIN), gtid(PID, CONN)
    corr = 0
    spans = {}
    cpu = 100 * MS

    def nxt():
        nonlocal corr
        corr += 1
        return corr

    for i in range(case.n_steps):
        c0 = cpu
        # inputs
        k = nxt()
        ex.call(c0 + 100 * US, c0 + 110 * US, "cudaMemcpyAsync_v3020", k, main)
        g0 = c0 + 200 * US
        ex.copy(g0, g0 + 20 * US, k, PID, 4096, 1, stream=COMPUTE)
        graph_at = g0 + 40 * US
        if i in case.pd_steps:
            at = g0 + 1 * MS
            total = int(sum(case.copy_ms) * MS)
            if not case.rdma:
                for nbytes, ms in zip(case.copy_bytes, case.copy_ms):
                    k = nxt()
                    tid = conn if case.issuer == "connector" else main
                    ex.call(at - 50 * US, at - 40 * US, "cudaMemcpyAsync_v3020", k, tid)
                    ex.copy(at, at + int(ms * MS), k, PID, nbytes, 1, stream=KV_STREAM)
                    at += int(ms * MS)
            if case.wait:
                ex.call(c0 + 150 * US, c0 + 155 * US, "cudaStreamWaitEvent_v3020", nxt(), main)
                graph_at = g0 + 1 * MS + total  # the forward starts when the KV is in
        k = nxt()
        ex.call(c0 + 160 * US, c0 + 180 * US, "cudaGraphLaunch_v10000", k, main)
        g_end = graph_at + int(case.graph_ms * MS)
        ex.graph_trace(graph_at, g_end, k, PID, stream=COMPUTE)
        k = nxt()
        ex.call(c0 + 190 * US, c0 + 195 * US, "cudaLaunchKernel_v7000", k, main)
        ex.kernel(g_end + 5 * US, g_end + 45 * US, k, PID, name="argmax_kernel", stream=COMPUTE)
        k = nxt()
        ex.call(c0 + 200 * US, c0 + 210 * US, "cudaMemcpyAsync_v3020", k, main)
        d_end = g_end + 60 * US
        ex.copy(g_end + 50 * US, d_end, k, PID, 8 * 32, 2, stream=COMPUTE)
        ex.call(c0 + 215 * US, d_end + 10 * US, "cudaStreamSynchronize_v3020", nxt(), main)
        ex.nvtx(c0, d_end + 20 * US, "execute_model", main)
        spans[i] = (g0, d_end)
        cpu = d_end + 1 * MS
    ex.close()
    return spans
