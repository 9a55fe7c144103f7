"""The regime surfaces of ``analyze``: the text section and the HTML table and bands (issue 23 item 8).
A real diagnosis of a 150-step EP hotspot, and hand-built Regimes for the cases a capture rarely has
(many episodes, an unknown one, saturation)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diag_cases as dc  # noqa: E402

from mixdiag.causes import color  # noqa: E402
from mixdiag.diagnosis import diagnose  # noqa: E402
from mixdiag.diagnosis.rules.decomposition import EPISODE_RESULT_COLUMNS, Regimes  # noqa: E402
from mixdiag.report import excess_rows, regime_lines, render  # noqa: E402
from mixdiag.report_html import figure, regimes_html  # noqa: E402


@pytest.fixture(scope="module")
def hotspot():
    faults = {k: dict(expert_imbalance=4.0, dur=0.050) for k in range(300, 450)}
    faults[100] = dict(kind="mixed", prefill_tokens=512, prefill_reqs=1, dur=0.110, graph_mode="PIECEWISE")
    return diagnose(dc.build(700, faults))


def _episode(i, cause="mixing", excess=1.0, why="", inst="e0", t=10.0):
    return dict(instance=inst, episode=i, step_start=i * 100, step_end=i * 100 + 20, t_start_s=t + i, t_end_s=t + i + 0.5,
                rows=21, reference_s=0.020, median_latency_s=0.030, ratio=1.5, excess_s=excess, cause=cause,
                shares={cause: 0.6, "unknown": 0.4} if cause != "unknown" else {"unknown": 1.0}, why=why)


def _fake(episodes=(), excess=None, saturation=None):
    reg = Regimes(episodes=pd.DataFrame(list(episodes), columns=EPISODE_RESULT_COLUMNS),
                  excess_s=excess or {}, saturation=saturation or {})
    return SimpleNamespace(regimes=reg, steps=pd.DataFrame({"t_start_s": [10.0, 30.0]}))


def test_the_text_names_the_episode_its_cause_and_the_exact_excess(hotspot):
    text = render(hotspot)
    section = text.split("\nRegimes\n", 1)[1].split("\n\n", 1)[0].splitlines()
    total = hotspot.regimes.excess_by_cause()
    whole = sum(total.values())
    ep_line = next(line for line in section if line.startswith("ep_hotspot"))
    assert ep_line.split()[1:] == [f"{total['ep_hotspot']:.3f}", f"{total['ep_hotspot'] / whole:.0%}"]
    e = hotspot.regimes.episodes.iloc[0]
    t0 = hotspot.steps["t_start_s"].min()
    row = section[-1].split()
    assert section[-3] == "1 sustained episode(s), by excess:"
    assert row[:4] == ["engine0", f"{e.t_start_s - t0:.3f}", f"{e.t_end_s - t0:.3f}", str(int(e.rows))]
    assert row[-2:] == ["ep_hotspot", f"({e.shares['ep_hotspot']:.0%})"] and f"{e.excess_s:.3f}" in row


def test_top_episodes_by_excess_with_a_count_of_the_rest_and_why_when_unknown():
    eps = [_episode(i, excess=float(i)) for i in range(6)] + [_episode(9, "unknown", 100.0, "no measured evidence")]
    lines = regime_lines(_fake(eps, {"e0": {"mixing": 3.0, "unknown": 1.0}}), top=3)
    assert "4 more episode(s)" in lines[-1]
    shown = lines[lines.index("7 sustained episode(s), top 3 by excess:") + 2:-1]
    assert [float(line.split()[7]) for line in shown] == [100.0, 5.0, 4.0]
    assert shown[0].endswith("unknown (100%) - no measured evidence") and shown[1].endswith("mixing (60%)")
    assert excess_rows(_fake(excess={"e0": {"mixing": 3.0, "unknown": 1.0}}).regimes) == [
        ("mixing", 3.0, 0.75), ("unknown", 1.0, 0.25)]


def test_a_saturated_instance_gets_its_line_first():
    sat = {"e0": dict(saturated=True, waiting_share=0.8, running_at_limit_share=0.9, running_max=64.0),
           "e1": dict(saturated=False)}
    lines = regime_lines(_fake(saturation=sat))
    assert lines[1:3] == ["Regimes", "saturated: e0 - requests waited after 80% of its rows, the running batch "
                                     "at its limit (64) in 90% of those"]
    assert "e1" not in "\n".join(lines)


def test_nothing_regime_related_adds_nothing():
    assert regime_lines(_fake()) == [] and regimes_html(_fake()) == ""
    assert regime_lines(SimpleNamespace()) == []  # a Diagnosis without the regime stage


def test_html_table_and_one_band_per_episode_coloured_by_cause(hotspot):
    section = regimes_html(hotspot)
    e = hotspot.regimes.episodes.iloc[0]
    assert f"<td>{e.excess_s:.3f}</td>" in section and f"ep_hotspot ({e.shares['ep_hotspot']:.0%})" in section
    fig = figure(hotspot)
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    t0 = hotspot.steps["t_start_s"].min()
    assert len(bands) == 1 and bands[0].fillcolor == color("ep_hotspot") and bands[0].yref == "paper"
    assert bands[0].x0 == pytest.approx(e.t_start_s - t0) and bands[0].x1 == pytest.approx(e.t_end_s - t0)
    assert "episode: ep_hotspot" in {t.name for t in fig.data}


def test_no_band_without_an_episode():
    faults = {k: dict(kind="mixed", prefill_tokens=512, prefill_reqs=1, dur=0.110) for k in range(20, 300, 9)}
    d = diagnose(dc.build(320, faults))
    assert not len(d.regimes.episodes)
    fig = figure(d)
    assert not [s for s in fig.layout.shapes if s.type == "rect"]
    assert not [t for t in fig.data if (t.name or "").startswith("episode")]
    assert "No sustained episode" in regimes_html(d)


def test_an_episode_inside_another_says_so():
    eps = [_episode(0, "mixing", 5.0), _episode(1, "host_stall", 2.0, "inside episode 0 (mixing): its rows' own "
                                                                    "evidence names host_stall")]
    lines = regime_lines(_fake(eps))
    assert lines[-1].endswith("host_stall (60%) - inside episode 0 (mixing): its rows' own evidence names host_stall")
    assert lines[-2].endswith("mixing (60%)")
