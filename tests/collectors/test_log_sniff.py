"""Format detection reads a log past the first 64 KiB (bounded) when its head holds no known line."""
import pytest

from mixdiag.collectors import registry

BANNER = "INFO 11-04 14:09:07 [model_runner.py:1] loading weights ... " + "x" * 100 + "\n"


@pytest.mark.parametrize("line,fmt", [
    ("INFO 11-04 14:19:07 [loggers.py:259] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
     "throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%\n",
     "vllm-log"),
    ("[2026-04-05 20:02:51] Decode batch, #running-req: 32, #token: 11179, token usage: 0.08, cuda graph: True, "
     "gen throughput (token/s): 1635.11, #queue-req: 0\n", "sglang-log"),
])
def test_first_stats_line_far_down(tmp_path, line, fmt):
    p = tmp_path / "server.log"
    p.write_text(BANNER * 3000 + line)  # ~500 KiB of start-up banner first
    assert p.stat().st_size > registry.HEAD_BYTES
    assert registry.detect(p) == fmt


def test_bounded(tmp_path):
    p = tmp_path / "server.log"
    with open(p, "w") as f:
        f.write(BANNER * (registry.LOG_SNIFF_BYTES // len(BANNER) + 10))
        f.write("INFO 11-04 14:19:07 [core.py:349] Iteration(1): 0 context requests, 0 context tokens, "
                "1 generation requests, 1 generation tokens, iteration elapsed time: 1.00 ms\n")
    with pytest.raises(Exception, match="no known format"):
        registry.detect(p)


# A DP engine's DEBUG log: only EPLB, KV-transfer, remote-KV-wait or DEBUG lines (reference/formats.md §1.2, §2.1)
_V = "(EngineCore_DP1 pid=2010410) {lvl} 12-22 21:44:{s:02d} [{f}] {msg}"
_VLLM_ONLY = {
    "eplb": ("INFO", "eplb_state.py:731", "EPLB step: avg_tokens=812.50, max_tokens=1400, balancedness=0.5804"),
    "kv": ("INFO", "nixl_connector.py:2115", "KV Transfer metrics: KVConnectorType: NixlConnector, Num successful "
           "transfers=3, Avg xfer time (ms)=12.5, P90 xfer time (ms)=20.1, Avg MB per transfer=64.0"),
    "remote": ("DEBUG", "scheduler.py:555", "cmpl-8c1f is still in WAITING_FOR_REMOTE_KVS state."),
    "debug": ("DEBUG", "core.py:412", "EngineCore waiting for work."),
}


@pytest.mark.parametrize("kind", sorted(_VLLM_ONLY))
def test_vllm_log_of_only_eplb_kv_or_debug_lines(tmp_path, kind):
    from mixdiag.collectors.logs import vllm_log
    from mixdiag.errors import UserError

    lvl, f, msg = _VLLM_ONLY[kind]
    p = tmp_path / "dp1.log"
    p.write_text("".join(_V.format(lvl=lvl, s=s, f=f, msg=msg) + "\n" for s in range(20)))
    assert registry.detect(p) == "vllm-log"
    if kind == "debug":  # recognised, and said plainly that nothing in it is measured
        with pytest.raises(UserError, match="no vLLM stats/iteration/metrics line"):
            vllm_log.read(p, year=2025)
        return
    tl = vllm_log.read(p, year=2025)
    src = tl.meta["sources"][0]
    assert src["lines_parsed"] == 20 and len(tl.series) > 0 and not src["partial"]
    if kind == "remote":
        waits = tl.series[tl.series["name"] == "vllm_log:waiting_for_remote_kvs_reqs"]
        assert len(waits) == 20 and set(waits["value"]) == {1.0}


@pytest.mark.parametrize("line", [
    "[2026-01-02 03:04:05 DP1 TP0 EP1] [Expert Balancedness] forward_pass_id=12 current_pass_balancedness=0.8123 "
    "last_10_average_balancedness=0.85 last_100_average_balancedness=0.86 last_1000_average_balancedness=0.86 "
    "gpu_physical_count_sum=4096",
    "[2026-01-02 03:04:05.123 DP1 TP0 EP1] Scheduler hit an exception: nothing, debug line",
])
def test_sglang_log_of_only_balancedness_or_ranked_lines(tmp_path, line):
    p = tmp_path / "dp1.log"
    p.write_text((line + "\n") * 5)
    assert registry.detect(p) == "sglang-log"
