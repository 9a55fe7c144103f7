"""Steps and tokens from the step shapes real engines leave in Nsight traces (issue 24 item 2).

Each fixture is a small export written here (tests/helpers/trace_shapes.py, real 3.25 DDL) whose shape
follows the engine source named in its ``basis``; the step count, boundaries and kinds are known by
construction. Per fixture the reconstruction must find every boundary (recall, precision), give each
step its kind where the trace holds evidence for it and ``unknown`` where it does not (never a wrong
kind), and infer prompt tokens only from measured copies (NaN otherwise, never planned).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mixdiag.collectors.traces.kineto import reader as kineto
from mixdiag.collectors.traces.nsys import reader as nsys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.trace_shapes import (COMPUTE, COPY_STREAM, Shape, build, fa2_splitkv, fa3, flashinfer_sglang,  # noqa: E402
                                  flashinfer_split, score)

VLLM_INPUTS = "vllm/v1/worker/gpu_model_runner.py _prepare_inputs: copy_to_gpu of input_ids (int32), positions " \
              "(int64), query_start_loc and seq_lens (int32), slot_mapping (int64) every step"
DEEPEP_LL = ("void deep_ep::internode_ll::dispatch<...>(...)", "void deep_ep::internode_ll::combine<...>(...)")
DEEPEP_NORMAL = ("void deep_ep::intranode::dispatch<...>(...)", "void deep_ep::intranode::combine<...>(...)")


@dataclass(frozen=True)
class Case:
    """A shape and what its trace can show: the step method, the kind reported per true kind
    (``unknown`` where no evidence separates it), and whether prompt tokens are measurable."""

    shape: Shape
    step_source: str
    kinds: dict
    tokens_inferred: bool
    comm: bool = False


CASES = [
    Case(Shape("vllm_async_fa2_paged",
               f"vLLM V1 --async-scheduling. {VLLM_INPUTS}; vllm/v1/worker/gpu/async_utils.py AsyncOutput: the "
               "sampled ids go D2H on copy_stream from the engine thread, copy_event.synchronize() runs in "
               "get_output(), called by async_output_busy_loop (vllm/v1/executor/multiproc_executor.py) on "
               "another thread; the host prepares step n+1 while the GPU runs n (no GPU idle). FA2 with a block "
               "table: flash_api.cpp mha_varlen_fwd -> run_mha_fwd(params, stream, paged_KV) runs "
               "flash_fwd_splitkv_kernel for prefill too. Decode replays a FULL graph (graph-level trace).",
               fa2_splitkv, (4, 8, 8), (4, 4), False, 8, COPY_STREAM, "output-thread", True, True, True),
         "sync-pattern", {"decode": "decode", "mixed": "mixed"}, True),
    Case(Shape("sglang_overlap_gpu_inputs",
               "SGLang overlap scheduler (srt/managers/scheduler.py event_loop_overlap: batch n's "
               "copy_done.synchronize() after launching batch n+1). Inputs stay on the GPU: schedule_batch.py "
               "prepare_for_decode sets input_ids = output_ids, allocates out_cache_loc on the GPU and bumps "
               "seq_lens in place; prepare_for_extend uploads input_ids, seq_lens, prefix_lens, "
               "req_pool_indices. FlashInfer backend: extend runs BatchPrefillWithPagedKVCacheKernel; decode "
               "replays a CUDA graph (cuda_graph_runner.py). Default: no mixed chunk, prefill-only steps.",
               flashinfer_sglang, (8,), (8, 8, 8), True, 8, COMPUTE, "next-launch", True, True, False),
         "sync-pattern", {"decode": "decode", "prefill": "prefill"}, False),
    Case(Shape("sglang_overlap_mixed_chunk",
               "As sglang_overlap_gpu_inputs with --enable-mixed-chunk (ScheduleBatch.mix_with_running: the "
               "decodes ride in the extend batch as 1-token extends, sampled together).",
               flashinfer_sglang, (8,), (8, 8, 8), True, 8, COMPUTE, "next-launch", True, True, True),
         "sync-pattern", {"decode": "decode", "mixed": "mixed"}, False),
    Case(Shape("vllm_pp_stage0_fa2_deepep",
               f"vLLM pipeline stage 0 with async scheduling: gpu_model_runner.py execute_model returns "
               f"IntermediateTensors on a non-last PP rank (no logits, no sampler, so no sampled-id copy) and "
               f"the hidden states go to the next stage by NCCL send/recv. {VLLM_INPUTS}. FA2 paged (split-KV, "
               "Is_causal flag). MoE layers exchange with DeepEP: internode_ll (low latency) on decode, "
               "intranode (normal) on prompt steps (csrc/kernels/internode_ll.cu, intranode.cu). Eager.",
               fa2_splitkv, (4, 8, 8), (4, 4), False, None, COMPUTE, "none", True, False, True,
               per_layer=DEEPEP_LL, per_layer_prompt=DEEPEP_NORMAL),
         "launch-gaps", {"decode": "decode", "mixed": "unknown"}, False, comm=True),
    Case(Shape("vllm_pp_stage0_full_graphs",
               "As vllm_pp_stage0_fa2_deepep with CUDA graphs: decode batches replay one FULL graph "
               "(vllm/v1/cudagraph_dispatcher.py: uniform decode -> FULL; DeepEP low-latency is graph-capturable), "
               "so a decode burst is the input copies, one cudaGraphLaunch and the stage's send. Inside a "
               "graph-level replay no attention kernel shows and no sampled-id copy counts requests: kinds stay "
               "unknown, boundaries do not.",
               fa2_splitkv, (4, 8, 8), (4, 4), False, None, COMPUTE, "none", True, True, True,
               per_layer=DEEPEP_LL, per_layer_prompt=DEEPEP_NORMAL),
         "launch-gaps", {"decode": "unknown", "mixed": "unknown"}, False, comm=True),
    Case(Shape("vllm_sync_fa3",
               f"vLLM V1 sync scheduling on Hopper with FlashAttention-3 (hopper/flash_api.cpp: one "
               f"FlashAttnFwdSm90 cutlass kernel for every phase, a name neither FA2 pattern matches). "
               f"{VLLM_INPUTS}; sampled ids D2H then cudaStreamSynchronize on the engine thread. Eager.",
               fa3, (4, 8, 8), (4, 4), False, 8, COMPUTE, "main", False, False, True),
         "sync-pattern", {"decode": "decode", "mixed": "mixed"}, True),
    Case(Shape("vllm_sync_fa2_paged_steady",
               f"vLLM V1 sync scheduling, FA2 paged (split-KV for prefill too), a fixed-concurrency benchmark: "
               f"the batch never drifts, so the sampled-id sizes (2 distinct) calibrate no request count and only "
               f"the kernels can tell kinds. {VLLM_INPUTS}. Eager.",
               fa2_splitkv, (4, 8, 8), (4, 4), False, 8, COMPUTE, "main", False, False, True, steady=True),
         "sync-pattern", {"decode": "decode", "mixed": "unknown"}, False),
    Case(Shape("vllm_pp_stage0_flashinfer_tp",
               "vLLM pipeline stage 0 (no sampler) with the FlashInfer backend (vllm/v1/attention/backends/"
               "flashinfer.py: decode wrapper on the decode rows, prefill wrapper on the prompt rows of one "
               "batch) and tensor parallelism (custom all-reduce, csrc/custom_all_reduce.cuh "
               f"cross_device_reduce_1stage). {VLLM_INPUTS}. Eager, async scheduling.",
               flashinfer_split, (4, 8, 8), (4, 4), False, None, COMPUTE, "none", True, False, True,
               per_layer=("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)",)),
         "launch-gaps", {"decode": "decode", "mixed": "mixed"}, False, comm=True),
]


READERS = {"nsys": (nsys, ".sqlite"), "kineto": (kineto, ".json")}


@pytest.mark.parametrize("seed", [7, 11])
@pytest.mark.parametrize("fmt", list(READERS))
@pytest.mark.parametrize("case", CASES, ids=[c.shape.name for c in CASES])
def test_shape_reconstructs(tmp_path, case, fmt, seed):
    """Nsight and Kineto (node-level: a graph replay shows a node kernel) carry the same evidence; the
    plans hold host stalls (20-80 ms), so the step split must not be the stall split."""
    reader, ext = READERS[fmt]
    path, truth = build(case.shape, tmp_path / f"{case.shape.name}{ext}", seed=seed, n_steps=60, fmt=fmt)
    assert (truth["host_stall_us"] > 0).any()
    tl = reader.read(path)
    assert tl.meta["sources"][0]["step_source"] == case.step_source
    s = tl.steps
    sc = score(s, truth)
    assert sc.recall == 1.0 and sc.precision == 1.0, (sc.recall, sc.precision)
    assert sc.wrong_claims == 0
    got = s["kind"].to_numpy()[sc.matched]
    want = truth["kind"].map(case.kinds).to_numpy()
    assert set(truth["kind"]) == set(case.kinds)          # the plan holds every kind the case speaks of
    assert (got == want).all(), dict(zip(truth["kind"], got))
    prompt = truth["kind"].to_numpy() != "decode"
    pt = s["prefill_tokens"].to_numpy()[sc.matched]
    dec = ~prompt & (got == "decode")
    assert (pt[dec] == 0).all() and np.isnan(pt[~prompt & ~dec]).all()   # decode: none; unknown kind: unknown
    if case.tokens_inferred:                               # measured from the token-proportional copies
        assert np.array_equal(pt[prompt], truth["prefill_tokens"].to_numpy()[prompt])
        rows = s["decode_rows"].to_numpy()[sc.matched]
        assert np.array_equal(rows, truth["decode_rows"].to_numpy())
    else:                                                  # nothing in the trace counts them: unknown
        assert np.isnan(pt[prompt]).all()
    assert (s["comm_s"].sum() > 0) == case.comm


def test_zero_copy_steps_of_a_non_llm_trace_are_not_decode(tmp_path):
    """The inputs-on-GPU rule needs the sampled-id copy: without it a step without input copies is
    nothing in particular (the pipeline-stage shape copies inputs every step, so strip them here)."""
    base = next(c.shape for c in CASES if c.shape.name == "vllm_pp_stage0_flashinfer_tp")
    shape = Shape("no_sampling_gpu_inputs", base.basis, fa3, (8,), (8,), True, None, COMPUTE, "none", True,
                  False, False)
    path, truth = build(shape, tmp_path / "x.sqlite", seed=5, n_steps=40)
    s = nsys.read(path).steps
    assert set(s["kind"]) == {"unknown"} and s["prefill_tokens"].isna().all()


def test_fa2_causal_on_every_step_leaves_the_kinds_to_the_copies(tmp_path):
    """vLLM V1 sync scheduling, FA2 paged, speculative decoding (k = 1): the verification rows keep
    ``Is_causal`` true in every step (flash_api.cpp clears it only when max_seqlen_q == 1), so the kernel's phase
    flag marks every step as prompt-bearing and says nothing. query_start_loc and seq_lens are copied whole,
    padded to max_num_seqs (gpu_model_runner.py ``copy_to_gpu()`` without a length): constant bytes every step.
    The copies must still tell decode from mixed steps."""
    from helpers.trace_shapes import fa2_splitkv_spec
    shape = Shape("vllm_sync_fa2_spec_padded", VLLM_INPUTS, fa2_splitkv_spec, (4, 8, 8), (), False, 8, COMPUTE, "main",
                  False, False, True, padded_copies=(4 * 1025, 4 * 1024), spec_tokens=1)
    path, truth = build(shape, tmp_path / "spec.sqlite", seed=7, n_steps=60)
    s = nsys.read(path).steps
    sc = score(s, truth)
    assert sc.recall == 1.0 and sc.precision == 1.0
    got = s["kind"].to_numpy()[sc.matched]
    assert (got == truth["kind"].to_numpy()).all(), list(zip(truth["kind"], got))
    pt = s["prefill_tokens"].to_numpy()[sc.matched]
    mixed = truth["kind"].to_numpy() == "mixed"
    assert (pt[~mixed] == 0).all() and (pt[mixed] > 0).all()
