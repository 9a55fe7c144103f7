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
