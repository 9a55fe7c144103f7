"""``mixdiag run``: a small scenario end to end, the run directory it writes, and its refusals."""
import json

import pandas as pd
import pytest

from mixdiag.cli import main
from mixdiag.schema import Timeline

SMALL = """
name = "small"
seed = 3
max_steps = 60
[model]
preset = "tiny"
num_layers = 2
hidden_size = 64
intermediate_size = 128
moe_intermediate_size = 64
[scheduler]
policy = "{policy}"
max_num_batched_tokens = 64
chunked_prefill_size = 64
[[workload.groups]]
name = "chat"
count = 4
prompt_len = {{ dist = "uniform", low = 8, high = 20 }}
output_len = {{ dist = "fixed", value = 12 }}
[[workload.groups]]
name = "long"
count = 1
arrival = "fixed"
start = 4
prompt_len = {{ dist = "fixed", value = 150 }}
output_len = {{ dist = "fixed", value = 2 }}
"""


def scenario(tmp_path, policy):
    p = tmp_path / f"{policy}.toml"
    p.write_text(SMALL.format(policy=policy))
    return str(p)


@pytest.mark.parametrize("policy,mixed", [("token_budget", True), ("prefill_first", False)])
def test_run_writes_run_directory(tmp_path, capsys, policy, mixed):
    out = tmp_path / "run"
    assert main(["run", "--scenario", scenario(tmp_path, policy), "--out", str(out), "--json", "-q"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for f in ("steps.parquet", "tokens.parquet", "series.parquet", "meta.json", "summary.json", "truth.csv"):
        assert (out / f).exists(), f
    tl = Timeline.load(out)
    kinds = set(tl.steps["kind"])
    assert ("mixed" in kinds) == mixed and {"prefill", "decode"} <= kinds
    assert tl.meta["scenario"] == "small" and tl.meta["seed"] == 3
    assert (tl.steps["graph_replayed"] == 0).all() and set(tl.steps["graph_mode"]) <= {"FULL", "PIECEWISE", "NONE"}
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["requests"] == {"submitted": 5, "finished": 5, "truncated_run": False}
    assert summary["output_tokens"] == 4 * 12 + 2 == len(tl.tokens) and summary["itl_s"]["p99"] > 0
    truth = pd.read_csv(out / "truth.csv")
    assert list(truth.columns) == ["instance", "step", "cause"]
    assert ("mixing" in set(truth["cause"])) == mixed
    if not mixed:
        assert summary["decode_stall_steps"] > 0 and "prefill_stall" in set(truth["cause"])


def test_seed_and_max_steps(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--scenario", scenario(tmp_path, "mix_running"), "--seed", "9", "--max-steps", "5",
                 "--out", str(out), "--json", "-q"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["seed"] == 9 and s["steps"] == 5 and s["requests"]["truncated_run"]


@pytest.mark.parametrize("args,msg", [
    (["--scenario", "no-such-scenario"], "unknown scenario"),
    (["--scenario", "mixed-default", "--max-steps", "0"], "--max-steps"),
])
def test_bad_input_exits_2(tmp_path, capsys, args, msg):
    assert main(["run", *args, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and msg in err and len(err.strip().splitlines()) == 1


def test_refuses_non_empty_out(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["run", "--scenario", scenario(tmp_path, "token_budget"), "--out", str(out)]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine" and len(list(out.iterdir())) == 1


def write_tiny_checkpoint(d):
    """A 2-layer Llama-style checkpoint (config.json + model.safetensors) with random weights."""
    import torch
    from safetensors.torch import save_file

    hf = {"model_type": "llama", "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24,
          "max_position_embeddings": 256, "eos_token_id": 2, "torch_dtype": "float32"}
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    t = {"model.embed_tokens.weight": r(50, 16), "model.norm.weight": torch.ones(16), "lm_head.weight": r(50, 16)}
    for i in range(2):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": torch.ones(16), p + "post_attention_layernorm.weight": torch.ones(16),
                  p + "self_attn.q_proj.weight": r(16, 16), p + "self_attn.k_proj.weight": r(8, 16),
                  p + "self_attn.v_proj.weight": r(8, 16), p + "self_attn.o_proj.weight": r(16, 16),
                  p + "mlp.gate_proj.weight": r(24, 16), p + "mlp.up_proj.weight": r(24, 16),
                  p + "mlp.down_proj.weight": r(16, 24)})
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf))
    save_file(t, str(d / "model.safetensors"))


def test_run_with_local_checkpoint(tmp_path, capsys):
    write_tiny_checkpoint(tmp_path / "ckpt")
    text = SMALL.format(policy="token_budget").split("[scheduler]")
    model_end = text[0].index("[model]")
    toml = text[0][:model_end] + '[model]\ncheckpoint = "ckpt"\n\n[scheduler]' + text[1]
    (tmp_path / "ck.toml").write_text(toml)
    out = tmp_path / "run"
    assert main(["run", "--scenario", str(tmp_path / "ck.toml"), "--out", str(out), "--json", "-q"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["requests"]["finished"] == 5 and s["steps_by_kind"]["mixed"] > 0
    tl = Timeline.load(out)
    assert tl.meta["model"]["layers"] == 2 and tl.meta["model"]["checkpoint"] == str((tmp_path / "ckpt").resolve())


def test_checkpoint_with_shape_override_refused(tmp_path, capsys):
    write_tiny_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ck.toml").write_text('[model]\ncheckpoint = "ckpt"\nnum_layers = 3\n[[workload.groups]]\ncount = 1\n')
    assert main(["run", "--scenario", str(tmp_path / "ck.toml"), "--out", str(tmp_path / "r")]) == 2
    assert "only 'dtype' may be set" in capsys.readouterr().err
