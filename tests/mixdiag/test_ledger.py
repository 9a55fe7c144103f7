import json
import math

import pytest

from mixdiag.cli import main
from mixdiag.ledger.device_model import DEVICES, predict
from mixdiag.errors import UserError
from mixdiag.ledger.shapes import PRESETS, BatchShape, config_dict, ledger, load_config
from mixdiag.ledger.spike_height import predicted_height

ARTICLE = BatchShape(prefill_tokens=8192, decode_reqs=32, spec_tokens=5, context_len=131072)
KEYS = ("dp_gather_bytes", "moe_dispatch_bytes", "moe_combine_bytes", "moe_total_bytes_all_layers",
        "decode_kv_read_bytes", "indexer_score_elements", "mtp_rows", "graph_mode")


@pytest.mark.parametrize("key,decode,mixed,scope", [
    ("dp_gather_bytes", 2_359_296, 103_022_592, "per_layer"),          # N x 6144 x 2
    ("moe_dispatch_bytes", 9_437_184, 412_090_368, "per_layer"),       # N x 8 x 6144 (FP8)
    ("moe_combine_bytes", 18_874_368, 824_180_736, "per_layer"),       # x2 (BF16)
    ("moe_total_bytes_all_layers", 2_123_366_400, 92_720_332_800, "all_layers"),  # x75: ~2.1 GB vs ~92 GB
    ("decode_kv_read_bytes", 257_949_696, 257_949_696, "per_layer"),   # 32 x 6 x 2048 x 656 B ~ 258 MB
    ("indexer_score_elements", 25_165_824, 25_165_824 + 8192 * 8192 // 2, "per_layer"),
    ("mtp_rows", 192, 192, "per_step"),
    ("graph_mode", "FULL", "NONE", "per_step"),
])
def test_article_shape_rows(key, decode, mixed, scope):
    doc = ledger(PRESETS["glm-5.3"], ARTICLE)
    assert (doc[key]["decode"], doc[key]["mixed"], doc[key]["scope"]) == (decode, mixed, scope)
    assert doc["rows_total"] == {"decode": 192, "mixed": 8384}


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("shape", [ARTICLE, BatchShape(512, 7, 0, 4096, 1000), BatchShape(0, 1, 3, 10)])
def test_rows_are_consistent(preset, shape):
    m = PRESETS[preset]
    doc = ledger(m, shape)
    for col in ("decode", "mixed"):
        per_layer = doc["moe_dispatch_bytes"][col] + doc["moe_combine_bytes"][col]
        assert doc["moe_total_bytes_all_layers"][col] == per_layer * m.moe_layers
        assert doc["moe_combine_bytes"][col] == 2 * doc["moe_dispatch_bytes"][col]
        rows = doc["rows_total"][col]
        assert doc["dp_gather_bytes"][col] == rows * m.hidden_size * 2
    # every MoE/gather row scales with rows: one ratio for all of them
    r = doc["rows_total"]["mixed"] / doc["rows_total"]["decode"]
    for k in ("dp_gather_bytes", "moe_dispatch_bytes", "moe_combine_bytes", "moe_total_bytes_all_layers"):
        assert doc[k]["ratio"] == pytest.approx(r, rel=1e-3)
    assert all(doc[k]["scope"] in ("per_layer", "all_layers", "per_step") for k in KEYS)


def test_deepseek_preset():
    m = PRESETS["deepseek-v3.2"]
    assert (m.num_layers, m.hidden_size, m.moe_layers, m.top_k) == (61, 7168, 58, 8)
    doc = ledger(m, ARTICLE)
    assert doc["moe_dispatch_bytes"]["mixed"] == 8384 * 8 * 7168
    assert 600e9 < (m.num_layers * m.attn_params_per_layer() + m.moe_layers * 257 * m.expert_params()) < 700e9


@pytest.mark.parametrize("fmt", ["json", "toml"])
def test_config_file_reproduces_preset(tmp_path, fmt, capsys):
    data = config_dict(PRESETS["glm-5.3"])
    p = tmp_path / f"m.{fmt}"
    if fmt == "json":
        p.write_text(json.dumps(data))
    else:
        p.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in data.items()) + "\n")
    assert load_config(p) == PRESETS["glm-5.3"]
    args = ["ledger", "--prefill-tokens", "8192", "--decode-reqs", "32", "--spec-tokens", "5",
            "--context-len", "131072", "--json"]
    assert main(args + ["--config", str(p)]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(args + ["--preset", "glm-5.3"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a == b


@pytest.mark.parametrize("text,msg", [
    ('{"name": "x"}', "missing model config key"),
    ('{"name": "x", "bogus": 1}', "unknown model config key"),
    ("not json = = toml", "not a JSON or TOML"),
])
def test_bad_config_is_a_user_error(tmp_path, text, msg):
    p = tmp_path / "bad.cfg"
    p.write_text(text)
    with pytest.raises(UserError, match=msg):
        load_config(p)


def test_cli_acceptance_command_and_errors(capsys):
    rc = main(["ledger", "--preset", "glm-5.3", "--prefill-tokens", "8192", "--decode-reqs", "32",
               "--spec-tokens", "5", "--context-len", "131072", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["dp_gather_bytes"]["decode"] == 2_359_296 and doc["dp_gather_bytes"]["mixed"] == 103_022_592
    assert doc["moe_dispatch_bytes"]["decode"] == 9_437_184 and doc["moe_dispatch_bytes"]["mixed"] == 412_090_368
    for k in KEYS:
        assert set(doc[k]) >= {"decode", "mixed", "unit", "scope"}
    assert main(["ledger", "--config", "/no/such/file.toml"]) == 2
    assert capsys.readouterr().err.startswith("error: no such model config file")
    assert main(["ledger", "--decode-reqs", "-1"]) == 2
    assert main(["ledger"]) == 0
    assert "moe_total_bytes_all_layers" in capsys.readouterr().out


def test_predicted_spike_height_grows_with_the_chunk():
    m, dev = PRESETS["glm-5.3"], DEVICES["h200"]
    h = [predict(m, BatchShape(p, 32, 5, 131072), dev)["height_x"] for p in (0, 512, 2048, 8192)]
    assert h[0] == pytest.approx(1.0)
    assert h == sorted(h) and 3 < h[-1] < 12   # the article: "usually 5 to 10x" for 8K chunks


@pytest.mark.parametrize("ev,finite", [
    ({"prefill_tokens": 8192.0, "decode_rows": 192.0, "decode_reqs": 32.0}, True),
    ({"prefill_tokens": 0.0, "decode_rows": 8.0, "decode_reqs": 8.0}, True),    # pure decode: 1x
    ({"decode_rows": 8.0}, False),                                              # no allocation
    ({"prefill_tokens": 1024.0, "decode_rows": 0.0}, False),                    # no decodes to spike
])
def test_predicted_height_from_spike_evidence(ev, finite):
    h = predicted_height(ev, PRESETS["glm-5.3"], DEVICES["h200"], 131072)
    assert math.isfinite(h) == finite
    if ev.get("prefill_tokens") == 8192.0:
        assert 3 < h < 12   # the article's 5-10x for an 8K chunk beside 32 decodes
    if ev.get("prefill_tokens") == 0.0:
        assert h == pytest.approx(1.0)
