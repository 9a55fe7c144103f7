"""attach_events: the sorted merge gives what the obvious scan per event gives, row for row."""
import copy
import math
import random

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.logs import vllm_log
from mixdiag.collectors.logs.log_lines import attach_events
from mixdiag.collectors.logs.step_frame import attach_events_frame


def scan_attach(steps, events):
    """The reference: for each event, walk every row of its instance (the former implementation)."""
    by_inst = {}
    for r in steps:
        by_inst.setdefault(r["instance"], []).append(r)
    for rows in by_inst.values():
        rows.sort(key=lambda r: r["t_start_s"] if r["t_start_s"] is not None else -math.inf)
    acc, orphans = {}, 0
    for inst, t, col, value, how in events:
        rows = by_inst.get(inst)
        if not rows or t is None or not math.isfinite(value):
            orphans += 1
            continue
        target = None
        for r in rows:
            t0, t1 = r["t_start_s"], r["t_end_s"]
            if t0 is None:
                continue
            if t1 > t0 and t0 < t <= t1:
                target = r
                break
            if t1 == t0 and t0 <= t:
                target = r
        if target is None:
            target = rows[0] if rows[0]["t_start_s"] is not None and rows[0]["t_end_s"] >= t else None
        if target is None:
            orphans += 1
            continue
        acc.setdefault((id(target), col), [how]).append(value)
    index = {id(r): r for r in steps}
    for (rid, col), vals in acc.items():
        how, nums = vals[0], vals[1:]
        r = index[rid]
        prev = r.get(col)
        base = prev if isinstance(prev, float) and math.isfinite(prev) and how == "sum" else 0.0
        r[col] = base + sum(nums) if how == "sum" else sum(nums) / len(nums)
    return orphans


def scan_attach_frame(df, events):
    """scan_attach on the rows of a frame (untimed = NaN there, None here), written back column-wise."""
    rows = [{k: (None if k in ("t_start_s", "t_end_s") and v != v else v) for k, v in r.items()}
            for r in df.to_dict("records")]
    orphans = scan_attach(rows, events)
    for col in sorted({e[2] for e in events}):
        if any(col in r for r in rows):
            df[col] = np.array([r.get(col, math.nan) for r in rows], dtype=float)
    return orphans


def _rows(rng, n):
    rows, t = [], 100.0
    for i in range(n):
        inst = rng.choice(["a", "b"])
        kind = rng.random()
        if kind < 0.1:
            rows.append({"instance": inst, "t_start_s": None, "t_end_s": None})
            continue
        t += rng.choice([0.0, 0.5, 1.0, 2.0])  # ties on purpose: logs stamp many steps with one second
        if kind < 0.4:  # an interval, sometimes overlapping the next rows
            rows.append({"instance": inst, "t_start_s": t - rng.choice([1.0, 3.0, 10.0]), "t_end_s": t})
        else:
            rows.append({"instance": inst, "t_start_s": t, "t_end_s": t, "preempted_reqs": rng.choice([0.0, 2.0])})
    return rows


@pytest.mark.parametrize("seed", range(12))
def test_merge_equals_scan(seed):
    rng = random.Random(seed)
    rows = _rows(rng, rng.randint(0, 60))
    events = [(rng.choice(["a", "b", "c"]), rng.choice([None, rng.uniform(80, 200), 100.0 + 0.5 * rng.randint(0, 100)]),
               rng.choice(["preempted_reqs", "expert_imbalance", "kv_transfer_s"]),
               rng.choice([1.0, 2.5, math.nan]), rng.choice(["sum", "mean"])) for _ in range(rng.randint(0, 80))]
    # one column is always folded the same way (as the readers do)
    events = [(i, t, c, v, "mean" if c == "expert_imbalance" else "sum") for i, t, c, v, _ in events]
    a, b = copy.deepcopy(rows), copy.deepcopy(rows)
    assert attach_events(a, events) == scan_attach(b, events)
    assert a == b
    # the column-wise twin the vLLM reader uses: the same values, bit for bit
    frame = pd.DataFrame(rows, columns=["instance", "t_start_s", "t_end_s", "preempted_reqs"]).astype(
        {"t_start_s": float, "t_end_s": float, "preempted_reqs": float})
    assert attach_events_frame(frame, events) == scan_attach(copy.deepcopy(rows), events)
    for col in ("preempted_reqs", "expert_imbalance", "kv_transfer_s"):
        want = np.array([r.get(col, math.nan) for r in a], dtype=float)
        got = frame[col].to_numpy() if col in frame else np.full(len(a), math.nan)
        np.testing.assert_array_equal(got, want)


def test_vllm_log_events_land_as_the_scan_put_them(tmp_path, monkeypatch):
    lines = []
    for i in range(40):
        s = f"12-22 21:44:{i:02d}"
        lines.append(f"(EngineCore_DP0 pid=2) INFO {s} [core.py:349] Iteration({i}): {i % 3} context requests, "
                     f"{100 * (i % 3)} context tokens, 8 generation requests, 8 generation tokens, "
                     "iteration elapsed time: 11.0 ms")
        if i % 5 == 0:
            lines.append(f"(EngineCore_DP0 pid=2) INFO {s} [eplb_state.py:1] EPLB step: avg_tokens=100.00, "
                         f"max_tokens={100 + i}, balancedness=0.9")
            lines.append(f"(EngineCore_DP0 pid=2) INFO {s} [nixl.py:1] KV Transfer metrics: Num successful "
                         "transfers=2, Avg xfer time (ms)=5.0, Avg MB per transfer=1.5")
    p = tmp_path / "iter.log"
    p.write_text("\n".join(lines) + "\n")
    merged = vllm_log.read(p, year=2025).steps
    monkeypatch.setattr(vllm_log, "attach_events_frame", scan_attach_frame)
    scanned = vllm_log.read(p, year=2025).steps
    assert merged.equals(scanned)
    assert merged["expert_imbalance"].notna().sum() == 8 and merged["kv_transfer_bytes"].sum() == 8 * 2 * 1.5e6
