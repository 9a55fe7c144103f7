"""Real vLLM 0.32 captures (tests/fixtures/vllm032, cut from the testbed's runs): every series of 0.32
that bears on a cause lands in its column. Expected values are the raw exposition's own numbers,
increases computed by hand from the files (quoted beside each). Series the real run left at zero
(no prefix caching, no queue limit, no FLOP estimate on the CPU backend) are checked again on copies
of the real scrapes with those lines set to non-zero values."""
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors import load, registry
from mixdiag.collectors.clients import vllm_bench
from mixdiag.collectors.prometheus import scrape_reader
from mixdiag.diagnosis.detection.regimes import saturation
from mixdiag.errors import UserError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032"
SCRAPES = sorted((FIX / "scrapes").glob("*.prom"))
TIMES = [float(p.stem) for p in SCRAPES]  # 1796141814.370, .366 (+1), .370 (+2), .367 (+3)


@pytest.fixture(scope="module")
def real():
    tl = load(str(FIX / "scrapes"))
    return tl, tl.steps.sort_values("t_start_s").reset_index(drop=True)


def test_the_fixtures_are_four_scrapes_of_one_engine(real):
    tl, st = real
    assert len(SCRAPES) == 4 and len(st) == 3
    assert list(st["t_end_s"]) == pytest.approx(TIMES[1:])


def test_waiting_for_capacity_is_its_own_column(real):
    tl, st = real
    # num_requests_waiting_by_reason{reason="capacity"} at each interval's end: 1, 1, 0
    # (reason="deferred" is 0 throughout, num_requests_waiting 1, 1, 0)
    assert list(st["waiting_capacity_reqs"]) == [1.0, 1.0, 0.0]
    src = tl.meta["metric_sources"]["scrapes"]["waiting_capacity_reqs"]
    assert src == "vllm:num_requests_waiting_by_reason{reason=capacity}"


def test_request_tpot_quantiles_of_the_requests_that_finished(real):
    tl, st = real
    # request_time_per_output_token_seconds_count 98, 98, 98, 100: only the last interval saw requests
    # finish, both in (0.025, 0.05] (bucket le=0.025 stays 94, le=0.05 goes 98 -> 100). Interpolated:
    # P50 = 0.025 + 0.025 * (1 / 2), P99 = 0.025 + 0.025 * (1.98 / 2)
    assert st["tpot_p50_s"].iloc[:2].isna().all()
    assert st["tpot_p50_s"].iloc[2] == pytest.approx(0.0375)
    assert st["tpot_p99_s"].iloc[2] == pytest.approx(0.04975)
    assert tl.meta["signals"]["scrapes"]["tpot_p99_s"] == "measured"


def test_counters_of_the_real_run(real):
    tl, st = real
    # prompt_tokens_by_source_total{source="local_compute"} 8582, 8810, 8810, 12744
    assert list(st["prefill_tokens"]) == [228.0, 0.0, 3934.0]
    # prompt_tokens_cached_total 0 throughout (prefix caching off), admission_rejections_total 0 for both
    # reasons, num_preemptions_total 0, estimated_* 0 (no analytic model on the CPU backend)
    for col in ("prefix_hit_tokens", "rejected_reqs", "preempted_reqs", "flops_estimated", "hbm_bytes_estimated"):
        assert list(st[col]) == [0.0, 0.0, 0.0], col
    src = tl.meta["metric_sources"]["scrapes"]
    assert src["prefix_hit_tokens"] == "vllm:prompt_tokens_cached_total"
    assert src["rejected_reqs"] == "vllm:admission_rejections_total"
    sig = tl.meta["signals"]["scrapes"]
    assert sig["flops_estimated"] == sig["hbm_bytes_estimated"] == "estimated"


def _overlap_work(tokens, t_first0, t_first1, prefill_s, t0, t1, points=8):
    """The documented spreading, written out: ``points`` first tokens evenly over [t_first0, t_first1],
    each one's tokens evenly over the prefill time before it; the share inside [t0, t1]."""
    total = 0.0
    for k in range(points):
        f = t_first0 + (k + 0.5) / points * (t_first1 - t_first0)
        lo, hi = max(f - prefill_s, t0), min(f, t1)
        total += tokens / points * max(hi - lo, 0.0) / prefill_s
    return total


def test_prefill_work_is_the_kv_computed_tokens_spread_back(real):
    tl, st = real
    # Only the last interval saw requests finish (2 of them): request_prefill_kv_computed_tokens_sum
    # 7954 -> 11810 (3856 tokens), request_prefill_time_seconds_sum +1.7948872 s, request_decode_time
    # _seconds_sum +3.5660465 s over 2 requests. Their first tokens came one mean decode earlier.
    tokens, prefill, decode = 3856.0, 1.7948872049998954 / 2, 3.566046540000116 / 2
    a, b = TIMES[2] - decode, TIMES[3] - decode
    want = [_overlap_work(tokens, a, b, prefill, TIMES[i], TIMES[i + 1]) for i in range(3)]
    assert list(st["prefill_work_tokens"]) == pytest.approx(want, abs=1e-3)
    assert want[0] > 2000 and want[2] == 0  # the long prompt's chunks ran early, as the truth file says
    assert tl.meta["metric_sources"]["scrapes"]["prefill_work_tokens"].startswith(
        "vllm:request_prefill_kv_computed_tokens")
    # truth/iterations.log: context tokens per interval were 2232, 1503, 427; the prompt-counter basis
    # (3934 tokens counted at the long prompt's first token, 1816.57) would put most in the last one
    assert st["prefill_work_tokens"].iloc[2] < st["prefill_tokens"].iloc[2]


def test_cache_config_reaches_the_meta(real):
    tl, _ = real
    cfg = tl.meta["runtime"]["cache_config"]
    # vllm:cache_config_info{block_size="128",num_gpu_blocks="1365",cache_dtype="auto",
    # enable_prefix_caching="False",num_cpu_blocks="None",kv_cache_memory_bytes="1073741824",...} 1.0
    assert cfg["block_size"] == 128 and cfg["num_gpu_blocks"] == 1365 and cfg["cache_dtype"] == "auto"
    assert cfg["enable_prefix_caching"] is False and cfg["num_cpu_blocks"] is None
    assert cfg["kv_cache_memory_bytes"] == 1073741824 and "engine" not in cfg


def test_small_kv_preemptions_are_corroborated_by_the_requests():
    tl = load(str(FIX / "small_kv"))
    # one scrape: num_preemptions_total 75; request_num_preemptions_sum 75 over 84 finished requests
    note = [n for n in tl.meta["notes"] if "preemption" in n]
    assert note and "75 preemption(s) since the server started" in note[0] and "75 in the requests" in note[0]
    assert tl.meta["runtime"]["cache_config"]["num_gpu_blocks"] == 6  # --faults small_kv: 6 KV blocks
    s = tl.series[tl.series["name"] == "vllm:num_preemptions_total"]
    assert list(s["value"]) == [75.0]


def _set(text: str, name: str, value: float, **labels) -> str:
    """The real exposition with one series' value replaced (every label given must match)."""
    out, hit = [], 0
    for line in text.splitlines():
        m = re.match(r"^([^\s{]+)(\{[^}]*\})?\s+(\S+)$", line)
        if m and m.group(1) == name and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            line, hit = f"{m.group(1)}{m.group(2) or ''} {value!r}", hit + 1
        out.append(line)
    assert hit == 1, (name, labels, hit)
    return "\n".join(out) + "\n"


def _drop(text: str, name: str) -> str:
    return "\n".join(x for x in text.splitlines() if not x.startswith(name + "{")) + "\n"


def _variant(edit_last):
    """The first and last real scrapes (one 3 s interval), the last edited."""
    first, last = SCRAPES[0].read_text(), edit_last(SCRAPES[-1].read_text())
    tl = scrape_reader.read_scrapes([(TIMES[0], first), (TIMES[-1], last)], instance="v")
    return tl


def test_nonzero_cached_rejected_and_estimated_series():
    def edit(t):
        t = _set(t, "vllm:prompt_tokens_cached_total", 640.0)
        t = _set(t, "vllm:prompt_tokens_cached_by_source_total", 512.0, source="device")
        t = _set(t, "vllm:prompt_tokens_cached_by_source_total", 128.0, source="host")
        t = _set(t, "vllm:admission_rejections_total", 3.0, reason="max_num_queued_reqs")
        t = _set(t, "vllm:admission_rejections_total", 2.0, reason="max_num_queued_tokens")
        t = _set(t, "vllm:estimated_flops_per_gpu_total", 7.5e12)
        t = _set(t, "vllm:estimated_read_bytes_per_gpu_total", 4.0e9)
        return _set(t, "vllm:estimated_write_bytes_per_gpu_total", 1.0e9)
    tl = _variant(edit)
    row = tl.steps.iloc[0]
    assert row["prefix_hit_tokens"] == 640.0 and row["rejected_reqs"] == 5.0
    assert row["flops_estimated"] == 7.5e12 and row["hbm_bytes_estimated"] == 5.0e9
    # the splits go to series, one per tier / reason
    inc = tl.series[tl.series["name"].str.endswith(":increase")]
    by = {(n, lab): v for n, lab, v in zip(inc["name"], inc["labels"], inc["value"])}
    assert by[("vllm:prompt_tokens_cached_by_source_total:increase", "source=device")] == 512.0
    assert by[("vllm:prompt_tokens_cached_by_source_total:increase", "source=host")] == 128.0
    assert by[("vllm:admission_rejections_total:increase", "reason=max_num_queued_reqs")] == 3.0


def test_cached_tokens_fall_back_to_the_by_source_counters():
    # without prompt_tokens_cached_total: the by-tier counter summed (512 + 128) ...
    def by_tier(t):
        t = _drop(_set(t, "vllm:prompt_tokens_cached_by_source_total", 512.0, source="device"),
                  "vllm:prompt_tokens_cached_total")
        return _set(t, "vllm:prompt_tokens_cached_by_source_total", 128.0, source="p2p")
    tl = _variant(by_tier)
    assert tl.steps.iloc[0]["prefix_hit_tokens"] == 640.0
    assert tl.meta["metric_sources"]["v"]["prefix_hit_tokens"] == "vllm:prompt_tokens_cached_by_source_total"

    # ... and without either, prompt_tokens_by_source's local_cache_hit + external_kv_transfer (300 + 20);
    # local_compute (12744) is computed work, never a hit
    def by_source(t):
        t = _drop(_drop(t, "vllm:prompt_tokens_cached_total"), "vllm:prompt_tokens_cached_by_source_total")
        t = _set(t, "vllm:prompt_tokens_by_source_total", 300.0, source="local_cache_hit")
        return _set(t, "vllm:prompt_tokens_by_source_total", 20.0, source="external_kv_transfer")
    tl = _variant(by_source)
    assert tl.steps.iloc[0]["prefix_hit_tokens"] == 320.0


def test_preemptions_fall_back_to_the_per_request_histogram():
    def edit(t):
        return _set(_drop(t, "vllm:num_preemptions_total"), "vllm:request_num_preemptions_sum", 4.0)
    tl = _variant(edit)
    assert tl.steps.iloc[0]["preempted_reqs"] == 4.0
    assert tl.meta["metric_sources"]["v"]["preempted_reqs"] == "vllm:request_num_preemptions_sum"


def test_the_cpu_kv_wording_of_the_stats_line_reaches_kv_usage():
    log = (FIX / "vllm.log").read_text()
    want = [float(x) / 100 for x in re.findall(r"CPU KV cache usage: ([\d.]+)%", log)]
    assert len(want) == 4 and "GPU KV cache usage" not in log
    tl = load(str(FIX / "vllm.log"))
    assert list(tl.steps.sort_values("t_start_s")["kv_usage"]) == pytest.approx(want)


def test_the_gpu_kv_wording_reads_the_same(tmp_path):
    p = tmp_path / "gpu.log"
    p.write_text((FIX / "vllm.log").read_text().replace("CPU KV cache usage", "GPU KV cache usage"))
    cpu = load(str(FIX / "vllm.log")).steps.sort_values("t_start_s")["kv_usage"].tolist()
    assert load(str(p)).steps.sort_values("t_start_s")["kv_usage"].tolist() == pytest.approx(cpu)


def test_saturation_prefers_requests_waiting_for_capacity():
    n = 40
    rows = pd.DataFrame({"running_reqs": np.full(n, 12.0), "waiting_reqs": np.full(n, 3.0),
                         "waiting_capacity_reqs": np.zeros(n)})
    # every waiting request was deferred (LoRA budget, KV transfer): not a full server
    got = saturation(rows)
    assert not got["saturated"] and got["waiting_column"] == "waiting_capacity_reqs"
    rows["waiting_capacity_reqs"] = 3.0
    assert saturation(rows)["saturated"]
    # without the 0.32 column the total queue is the evidence, as before
    old = saturation(rows.drop(columns="waiting_capacity_reqs"))
    assert old["saturated"] and "waiting_column" not in old


def _bench(path: Path, starts: list[float]) -> Path:
    doc = {"backend": "vllm", "model_id": "tiny-llama", "date": "20261201-161626", "request_throughput": 1.0,
           "input_lens": [64] * len(starts), "output_lens": [3] * len(starts), "ttfts": [0.2] * len(starts),
           "itls": [[0.05, 0.05]] * len(starts), "errors": [""] * len(starts), "start_times": starts}
    path.write_text(json.dumps(doc))
    return path


def test_bench_start_times_are_anchored_by_the_clock_offset(tmp_path):
    # perf_counter readings (seconds since boot) of a vllm bench serve run and the offset
    # time.time() - time.perf_counter() read on the same host
    p = _bench(tmp_path / "bench.json", [5123.25, 5124.0, 5125.5])
    offset = 1796141814.37 - 5123.25 + 0.5
    assert registry.detect(p) == "vllm-bench"
    tl = load(str(p), clock_offset_s=offset)
    assert tl.meta["clock"] == "unix"
    first = tl.tokens[tl.tokens["request_id"] == "vllm-bench-0"]["t_s"].tolist()
    assert first == pytest.approx([5123.25 + offset + 0.2, 5123.25 + offset + 0.25, 5123.25 + offset + 0.3])
    later = tl.tokens[tl.tokens["request_id"] == "vllm-bench-2"]["t_s"].min()
    assert later == pytest.approx(5125.5 + offset + 0.2)
    # no anchor: seconds from the first start, said so
    rel = load(str(p))
    assert rel.meta["clock"] == "relative" and rel.tokens["t_s"].min() == pytest.approx(0.2)
    with pytest.raises(UserError):
        vllm_bench.read(p, t0=1.0, clock_offset_s=offset)


def test_clock_offset_flag_reaches_the_reader():
    from mixdiag.commands.flags import add_source_flags, source_options
    import argparse

    ap = argparse.ArgumentParser()
    add_source_flags(ap)
    assert source_options(ap.parse_args(["--clock-offset", "1796136691.62"])) == {"clock_offset_s": 1796136691.62}
    with pytest.raises(UserError):
        source_options(ap.parse_args(["--clock-offset", "nan"]))
