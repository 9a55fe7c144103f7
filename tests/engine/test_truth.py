"""Ground truth: the per-step cause rules on a real engine, and the truth.csv file."""
import pytest
import torch

from mixdiag.engine.config import EngineConfig, ModelConfig, SchedulerConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.core.request import SamplingParams
from mixdiag.engine.testbed.truth import CAUSES, TruthRecorder, read_truth, write_truth

SMALL = ModelConfig(hidden_size=64, num_layers=2, first_k_dense=1, num_heads=4, num_kv_heads=2, head_dim=16,
                    intermediate_size=96, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                    vocab_size=128, max_model_len=512)


def _run(policy):
    eng = Engine(EngineConfig(model=SMALL, num_threads=1,
                              scheduler=SchedulerConfig(policy=policy, max_num_batched_tokens=64,
                                                        chunked_prefill_size=64)))
    truth = TruthRecorder(eng)
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    for _ in range(4):
        eng.add_request(torch.randint(2, 128, (10,), generator=g).tolist(), params)
    recs = [eng.step() for _ in range(4)]                      # the short prompts are decoding now
    eng.add_request(torch.randint(2, 128, (150,), generator=g).tolist(), params)  # chunked over 3 steps
    recs += eng.run()
    return recs, truth


@pytest.mark.parametrize("policy, cause, kind", [("token_budget", "mixing", "mixed"),
                                                 ("mix_running", "mixing", "mixed"),
                                                 ("prefill_first", "prefill_stall", "prefill")])
def test_mixing_and_prefill_stall_rules(policy, cause, kind):
    recs, truth = _run(policy)
    labelled = {s for _, s, c in truth.rows if c == cause}
    late = [r for r in recs if r.step >= 4]
    expected = {r.step for r in late if r.kind == kind}
    assert expected and labelled >= expected
    assert all(c in CAUSES for _, _, c in truth.rows)
    assert not {s for _, s, _ in truth.rows} & {r.step for r in recs if r.kind == "decode"}


def test_truth_csv_round_trip_and_refusals(tmp_path):
    rows = [("engine1", 3, "host_stall"), ("engine0", 5, "mixing"), ("engine0", 5, "ep_hotspot")]
    p = write_truth(tmp_path / "truth.csv", rows)
    assert p.read_text().splitlines()[0] == "instance,step,cause"
    assert read_truth(p) == [("engine0", 5, "mixing"), ("engine0", 5, "ep_hotspot"), ("engine1", 3, "host_stall")]
    with pytest.raises(FileExistsError):
        write_truth(p, rows)
    with pytest.raises(ValueError, match="not one of"):
        write_truth(tmp_path / "bad.csv", [("engine0", 1, "cosmic_rays")])
    (tmp_path / "other.csv").write_text("a,b,c\n")
    with pytest.raises(ValueError, match="expected header"):
        read_truth(tmp_path / "other.csv")
