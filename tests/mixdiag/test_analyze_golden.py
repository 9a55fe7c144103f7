"""`analyze --json` pinned: the documents in tests/fixtures/golden/ were written before the issue-11
move (no behaviour change allowed), and by_cause, the headline and the exporter's counters agree."""
import json
from pathlib import Path

import pytest

from mixdiag.causes import CAUSES
from mixdiag.cli import main
from mixdiag.collectors import load
from mixdiag.diagnosis import diagnose
from mixdiag.exporter import DiagnosisExporter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = sorted((FIXTURES / "golden").glob("analyze_*.json"))


def _input(golden: Path) -> Path:
    name = golden.name[len("analyze_"):-len(".json")]
    hits = [p for p in (FIXTURES / "logs" / name, FIXTURES / "nsys" / name) if p.exists()]
    assert hits, f"no fixture for {golden.name}"
    return hits[0]


def test_golden_documents_are_pinned():
    assert len(GOLDEN) >= 4  # one per source kind: trace, SGLang log, vLLM log, metrics text


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.name)
def test_analyze_json_is_byte_identical(golden, capsys, monkeypatch):
    path = _input(golden)
    # the documents name no input path; run from the repo root as the pinning run did anyway
    monkeypatch.chdir(FIXTURES.parents[1])
    assert main(["analyze", str(path.relative_to(FIXTURES.parents[1])), "--json"]) == 0
    out = capsys.readouterr().out
    assert out == golden.read_text()
    json.loads(out)


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.name)
def test_by_cause_headline_and_exporter_agree(golden):
    tl = load(str(_input(golden)))
    d = diagnose(tl)
    counted = {c: int((d.spikes["cause"] == c).sum()) for c in CAUSES}
    assert d.by_cause == counted and list(d.by_cause) == list(CAUSES)
    assert d.headline.by_cause == d.by_cause and d.headline.n_spikes == len(d.spikes)
    assert d.to_json()["by_cause"] == d.by_cause
    assert d.headline.verdict == d.verdict
    last = d.last_spike
    assert (last == {}) == (len(d.spikes) == 0)
    if last:
        assert last["t_s"] == d.spikes["t_s"].max()
    snap = DiagnosisExporter().publish(tl, d, now=0.0)
    assert snap.spikes_total == d.by_cause
    assert snap.last_spike == last and snap.steps_analyzed == d.headline.n_steps
    # a second publication of the same diagnosis counts nothing twice
    again = DiagnosisExporter()
    again.publish(tl, d, now=0.0)
    assert again.publish(tl, d, now=1.0).spikes_total == d.by_cause
