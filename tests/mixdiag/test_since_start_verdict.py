"""One ``/metrics`` dump: its since-start summary is the verdict (issue 22), quantiles only as far as
the buckets shown ("<= 7.5 s", never 3.75 s interpolated up from a 0 no bucket shows), no spikes."""
import json
from pathlib import Path

from mixdiag.cli import main

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _analyze(path, capsys, *extra):
    assert main(["analyze", str(path), *extra]) == 0
    return capsys.readouterr().out


def test_sglang_dump_verdict_is_its_summary_and_names_no_spike(capsys):
    doc = json.loads(_analyze(LOGS / "sglang_metrics_docs.txt", capsys, "--json"))
    v = doc["verdict"]
    assert v.startswith("One /metrics dump (since process start): ITL P50 0.0931 s, P99 0.6323 s over 7400757 outputs")
    assert "no time structure" in v and "no spike causes" in v
    # the whole run's P99 is 6.8x its P50, but that is the run's tail, not a moment that spiked
    assert doc["spikes"] == [] and sum(doc["by_cause"].values()) == 0
    inst = doc["since_start"]["instances"]["sglang_metrics_docs"]
    assert 0.09 < inst["itl_p50_s"] < inst["itl_p99_s"]
    assert "bounds" not in inst  # both quantiles fall between buckets the dump shows
    text = _analyze(LOGS / "sglang_metrics_docs.txt", capsys)
    assert text.splitlines()[0] == v and "TPOT spikes" not in text


def test_vllm_dump_without_itl_states_ttft(capsys):
    doc = json.loads(_analyze(LOGS / "vllm_metrics_11117.txt", capsys, "--json"))
    assert doc["verdict"].startswith("One /metrics dump (since process start): TTFT P50 0.0300 s, P99 0.0398 s.")
    doc = json.loads(_analyze(LOGS / "vllm_metrics_ps318.txt", capsys, "--json"))
    assert "no ITL or TTFT histogram" in doc["verdict"] and "No TPOT spikes" not in doc["verdict"]


FRAGMENT = """# a /metrics dump cut above its lowest buckets
vllm:inter_token_latency_seconds_bucket{le="7.5",model_name="m"} 90.0
vllm:inter_token_latency_seconds_bucket{le="10.0",model_name="m"} 95.0
vllm:inter_token_latency_seconds_bucket{le="20.0",model_name="m"} 97.0
vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 100.0
vllm:inter_token_latency_seconds_count{model_name="m"} 100.0
vllm:inter_token_latency_seconds_sum{model_name="m"} 400.0
vllm:generation_tokens_total{model_name="m"} 101.0
"""


def test_fragment_quantiles_are_bounds_not_interpolations(tmp_path, capsys):
    p = tmp_path / "fragment.prom"
    p.write_text(FRAGMENT)
    doc = json.loads(_analyze(p, capsys, "--json"))
    # P50: rank 50 of 100 lies in the lowest bucket shown (<= 7.5); P99: rank 99 in +Inf (>= 20)
    assert "ITL P50 <= 7.5 s, P99 >= 20 s over 100 outputs" in doc["verdict"]
    (inst,) = doc["since_start"]["instances"].values()
    assert inst["itl_p50_s"] is None and inst["itl_p99_s"] is None
    assert inst["bounds"]["itl_p50_s"] == {"upper_s": 7.5} and inst["bounds"]["itl_p99_s"] == {"lower_s": 20.0}
    text = _analyze(p, capsys)
    assert "3.75" not in text and "<= 7.5 s" in text.splitlines()[0]
