import sys
from pathlib import Path

import pytest

from mixdiag.ledger.device_model import DEVICES
from mixdiag.diagnosis import diagnose
from mixdiag.ledger.shapes import PRESETS
from mixdiag.report_html import figure, write_html

sys.path.insert(0, str(Path(__file__).parent))
from diag_cases import build  # noqa: E402


def test_figure_has_the_four_signals_and_spikes_by_cause():
    fig = figure(diagnose(build()))
    names = {t.name for t in fig.data}
    assert {"ITL ms", "baseline ms", "prefill tokens", "decode rows", "SM active", "graph mode"} <= names
    assert {"spike: mixing", "spike: host_stall", "spike: ep_hotspot"} <= names
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:4] == ["TPOT / ITL per step, spikes coloured by cause", "token allocation", "SM activity",
                          "CUDA-graph mode"]


def test_write_html_is_self_contained_and_never_overwrites(tmp_path):
    p = tmp_path / "r.html"
    write_html(diagnose(build()), p, model=PRESETS["glm-5.3"], device=DEVICES["h200"])
    text = p.read_text()
    # plotly.js is inlined (its bundle only names a CDN as a default for geo maps); nothing after it loads
    assert "<script src=" not in text and len(text) > 3_000_000
    after = text.split("</script>", 1)[1]
    assert "https://" not in after.replace("https://plotly.com", "")
    assert text.count("measured height") == 1 and "predicted height" in text
    with pytest.raises(FileExistsError):
        write_html(diagnose(build()), p, model=PRESETS["glm-5.3"], device=DEVICES["h200"])


def test_budget_section_lists_each_cause_with_excess_and_p99_without():
    from mixdiag.report import render
    from mixdiag.report_html import budget_html

    d = diagnose(build())
    ib = d.budget.instances["engine0"]
    section, text = budget_html(d), render(d)
    charged = [c for c, cb in ib.by_cause.items() if cb.excess_s > 0]
    assert charged and "ITL excess budget, engine0" in text
    for c in charged:  # each charged cause appears with its excess in both reports
        assert f"<b>{c}</b>" in section and f"{ib.by_cause[c].excess_s:.3f}" in section
        assert any(line.startswith(c) and f"{ib.by_cause[c].excess_s:.3f}" in line for line in text.splitlines())
