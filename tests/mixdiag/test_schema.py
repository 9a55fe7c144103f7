"""The Timeline contract: validation, round trip, ITL/TPOT derivation, slicing, concat."""
import json

import numpy as np
import pandas as pd
import pytest

from mixdiag.schema import SchemaError, Timeline, columns, empty, validate


def steps_frame(n=4, instance="engine0", t0=100.0, dt=0.05):
    return pd.DataFrame({
        "instance": [instance] * n,
        "step": np.arange(n),
        "t_start_s": t0 + np.arange(n) * dt,
        "t_end_s": t0 + np.arange(n) * dt + dt * 0.9,
        "granularity": ["step"] * n,
        "kind": (["decode", "mixed"] * n)[:n],
        "prefill_tokens": ([0.0, 512.0] * n)[:n],
        "decode_rows": [32.0] * n,
        "graph_mode": (["FULL", "PIECEWISE"] * n)[:n],
    })


def tokens_frame(instance="engine0"):
    # request a: events at 1.0 (first), 1.1, 1.3 (2 tokens); request b: 1.05 (first), 1.25
    return pd.DataFrame({
        "instance": [instance] * 5,
        "request_id": ["a", "b", "a", "b", "a"],
        "t_s": [1.0, 1.05, 1.1, 1.25, 1.3],
        "n_tokens": [1, 1, 1, 1, 2],
    })


def series_frame(instance="engine0"):
    return pd.DataFrame({"instance": [instance] * 3, "name": ["DCGM_FI_PROF_SM_ACTIVE"] * 3,
                         "labels": ["gpu=0"] * 3, "t_s": [1.0, 2.0, 3.0], "value": [0.2, 0.9, 0.3]})


def test_optional_columns_filled_honestly():
    st = validate("steps", steps_frame())
    assert list(st.columns[: len(columns("steps"))]) == [c.name for c in columns("steps")]
    assert st["sm_active"].isna().all()            # unknown stays unknown, never 0
    assert st["expert_imbalance"].dtype == "float64"
    assert (st["step"].dtype, st["instance"].dtype) == (np.dtype("int64"), np.dtype(object))


def test_absent_columns_cost_no_memory_per_row_and_stay_writable():
    # a million-row log fills a dozen of ~50 documented columns: the rest must not hold n floats each
    st = validate("steps", steps_frame(n=1000))
    for col in ("sm_active", "kv_usage", "comm_s", "itl_p99_s"):
        v = st[col].to_numpy()
        assert np.isnan(v).all() and v.strides == (0,), col
    assert st["prefill_tokens"].to_numpy().strides == (8,)  # a filled column is an ordinary array
    # writing one absent column (DCGM filling sm_active later) changes that column only
    st.loc[st["step"] < 3, "sm_active"] = 0.5
    assert st["sm_active"].head(4).tolist()[:3] == [0.5, 0.5, 0.5] and np.isnan(st["sm_active"].iloc[3])
    assert st["kv_usage"].isna().all() and st["comm_s"].isna().all()
    st["kv_usage"] = 0.25
    assert (st["kv_usage"] == 0.25).all() and st["itl_p99_s"].isna().all()
    # a view or a shallow copy written alone (the validated frame gone) copies first too
    view = validate("steps", steps_frame(n=10)).iloc[2:6]
    view.loc[view.index[0], "comm_s"] = 1.0
    view.iloc[1, list(view.columns).index("itl_p99_s")] = 2.0
    assert view["comm_s"].iloc[0] == 1.0 and view["comm_s"].isna().sum() == 3
    assert view["itl_p99_s"].iloc[1] == 2.0 and view["itl_p99_s"].isna().sum() == 3

BAD_CASES = [
    # (mutation, frame, column named in the message)
    (lambda d: d.drop(columns=["t_start_s"]), "steps", "t_start_s"),
    (lambda d: d.assign(step=["x"] * len(d)), "steps", "step"),
    (lambda d: d.assign(prefill_tokens=["many"] * len(d)), "steps", "prefill_tokens"),
    (lambda d: d.assign(t_end_s=d["t_start_s"] - 0.01), "steps", "t_end_s"),
    (lambda d: d.assign(t_start_s=d["t_start_s"][::-1].to_numpy(), t_end_s=d["t_start_s"][::-1].to_numpy() + 0.01),
     "steps", "t_start_s"),
    (lambda d: d.assign(kind=["weird"] * len(d)), "steps", "kind"),
    (lambda d: d.assign(graph_mode=["CUDA"] * len(d)), "steps", "graph_mode"),
    (lambda d: d.assign(decode_rows=-1.0), "steps", "decode_rows"),
    (lambda d: d.assign(sm_active=1.5), "steps", "sm_active"),
    (lambda d: d.assign(step=0), "steps", "step"),
    (lambda d: d.assign(instance=None), "steps", "instance"),
]


@pytest.mark.parametrize("mutate,frame,column", BAD_CASES)
def test_validator_rejects_and_names_column(mutate, frame, column):
    with pytest.raises(SchemaError, match=f"'{column}'"):
        validate(frame, mutate(steps_frame()))


@pytest.mark.parametrize("mutate,column", [
    (lambda d: d.drop(columns=["request_id"]), "request_id"),
    (lambda d: d.assign(n_tokens=-1), "n_tokens"),
    (lambda d: d.assign(n_tokens=1.5), "n_tokens"),
    (lambda d: d.assign(t_s=[1.0, 1.05, 0.9, 1.25, 1.3]), "t_s"),   # request a goes backwards
    (lambda d: d.assign(t_s=np.nan), "t_s"),
])
def test_tokens_validator(mutate, column):
    with pytest.raises(SchemaError, match=f"'{column}'"):
        validate("tokens", mutate(tokens_frame()))


def test_series_time_backwards_rejected():
    bad = series_frame().assign(t_s=[3.0, 2.0, 1.0])
    with pytest.raises(SchemaError, match="'t_s'"):
        validate("series", bad)


def test_unknown_frame_and_non_frame():
    with pytest.raises(SchemaError, match="unknown frame"):
        validate("nope", steps_frame())
    with pytest.raises(SchemaError, match="DataFrame"):
        validate("steps", [1, 2])


def test_round_trip_exact(tmp_path):
    tl = Timeline(steps_frame(), tokens_frame(), series_frame(),
                  {"source": "test", "signals": {"engine0": {"sm_active": "estimated"}}})
    tl.save(tmp_path / "run")
    back = Timeline.load(tmp_path / "run")
    assert back.equals(tl)
    for f in ("steps", "tokens", "series"):
        pd.testing.assert_frame_equal(getattr(back, f), getattr(tl, f), check_exact=True)
    assert back.signal_quality("engine0", "sm_active") == "estimated"
    assert back.signal_quality("engine0", "graph_mode") == "absent"


def test_save_refuses_to_overwrite(tmp_path):
    tl = Timeline(steps_frame())
    tl.save(tmp_path)
    with pytest.raises(FileExistsError):
        tl.save(tmp_path)
    tl.save(tmp_path, overwrite=True)


def test_load_partial_and_missing(tmp_path):
    Timeline(steps_frame()).save(tmp_path / "r")
    (tmp_path / "r" / "tokens.parquet").unlink()
    back = Timeline.load(tmp_path / "r")
    assert back.meta["partial"] is True and len(back.tokens) == 0
    with pytest.raises(FileNotFoundError):
        Timeline.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SchemaError):
        Timeline.load(tmp_path / "empty")


def test_meta_must_be_json():
    with pytest.raises(SchemaError, match="meta"):
        Timeline(meta={"x": float("nan")})
    with pytest.raises(SchemaError, match="meta"):
        Timeline(meta={"x": object()})


def test_itl_known_answers():
    itl = Timeline(tokens=tokens_frame()).itl()
    got = {(r.request_id, round(r.t_s, 3)): (round(r.itl_s, 6), round(r.itl_per_token_s, 6)) for r in itl.itertuples()}
    assert got == {("a", 1.1): (0.1, 0.1), ("b", 1.25): (0.2, 0.2), ("a", 1.3): (0.2, 0.1)}


def test_tpot_known_answers():
    tp = Timeline(tokens=tokens_frame()).tpot().set_index("request_id")
    # a: 4 tokens, first event 1 token at 1.0, last at 1.3 -> 0.3 / 3
    assert tp.loc["a", "output_tokens"] == 4
    assert tp.loc["a", "tpot_s"] == pytest.approx(0.1)
    assert tp.loc["b", "tpot_s"] == pytest.approx(0.2)
    single = Timeline(tokens=tokens_frame().iloc[:1]).tpot()
    assert np.isnan(single.loc[0, "tpot_s"])


def test_slice_by_time_and_instance():
    tl = Timeline.concat([Timeline(steps_frame(10, "e0")), Timeline(steps_frame(10, "e1"))])
    s = tl.slice(100.1, 100.2)
    # steps overlapping [100.1, 100.2]: starts at 100.05(ends 100.095 -> no), 100.10, 100.15, 100.20
    assert sorted(set(s.steps["step"])) == [2, 3, 4]
    assert s.instances == ["e0", "e1"]
    only = tl.slice(instances="e1")
    assert only.instances == ["e1"] and len(only.steps) == 10


def test_concat_rejects_duplicate_instance_and_mixed_clocks():
    a = Timeline(steps_frame(3, "e0"))
    with pytest.raises(SchemaError, match="'instance'"):
        Timeline.concat([a, Timeline(steps_frame(3, "e0"))])
    b = Timeline(steps_frame(3, "e1"), meta={"clock": "relative"})
    with pytest.raises(SchemaError, match="clock"):
        Timeline.concat([a, b])
    assert len(Timeline.concat([]).steps) == 0


def test_to_csv(tmp_path):
    tl = Timeline(steps_frame())
    p = tl.to_csv(tmp_path / "steps.csv")
    back = pd.read_csv(p)
    assert list(back["kind"]) == list(tl.steps["kind"])
    assert list(back.columns[:6]) == ["instance", "step", "t_start_s", "t_end_s", "granularity", "kind"]
    with pytest.raises(FileExistsError):
        tl.to_csv(p)


def test_empty_frames_have_canonical_dtypes():
    e = empty("tokens")
    assert str(e["n_tokens"].dtype) == "int64" and len(e) == 0
    tl = Timeline()
    assert tl.span() is None and tl.instances == []
    json.dumps(tl.meta)


def test_spike_record_and_evidence_are_documented_beside_the_timeline(capsys):
    """`mixdiag schema` documents Diagnosis.spikes column by column and every evidence key it uses."""
    import sys
    from pathlib import Path

    from mixdiag.cli import main
    from mixdiag.diagnosis import diagnose, result
    sys.path.insert(0, str(Path(__file__).parent))
    from diag_cases import build

    d = diagnose(build())
    assert list(d.spikes.columns) == [c.name for c in result.SPIKE_COLUMNS]
    used = {k for ev in d.spikes["evidence"] for k in ev}
    assert used and used <= set(result.EVIDENCE_FIELDS)
    golden = Path(__file__).parents[1] / "fixtures" / "golden"
    for p in golden.glob("analyze_*.json"):
        assert {k for s in json.loads(p.read_text())["spikes"] for k in s["evidence"]} <= set(result.EVIDENCE_FIELDS)
    assert main(["schema", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in doc["spikes"]] == list(d.spikes.columns)
    assert {e["name"] for e in doc["evidence"]} == set(result.EVIDENCE_FIELDS)
