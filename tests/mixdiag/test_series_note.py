"""An input with series but no steps or intervals says what it holds (issue 22 item 4: a DP engine's log of only
EPLB and KV-transfer lines is recognised - and its content is not hidden behind "nothing to diagnose")."""
import pandas as pd

from mixdiag.cli import main
from mixdiag.diagnosis.series_note import SHOWN, series_note

_LINES = ("(EngineCore_DP1 pid=2010410) INFO 12-22 21:44:{s:02d} [eplb_state.py:731] EPLB step: avg_tokens=812.50, "
          "max_tokens=1400, balancedness={b}\n")


def test_a_log_of_only_eplb_lines_says_what_it_read(tmp_path, capsys):
    p = tmp_path / "dp1.log"
    p.write_text("".join(_LINES.format(s=s, b=0.58 if s % 2 else 0.91) for s in range(20)))
    assert main(["analyze", str(p)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("No steps or intervals in the input: nothing to diagnose. It holds 80 samples of 4 series")
    assert "balancedness 0.58-0.91 (20)" in first


def test_series_note_table():
    assert series_note(None) == "" and series_note(pd.DataFrame(columns=["name", "value"])) == ""
    many = pd.DataFrame({"name": [f"s{i}" for i in range(SHOWN + 2)], "value": 1.0})
    note = series_note(many)
    assert note.endswith(" and 2 more.") and "s0 1 (1)" in note
    assert series_note(pd.DataFrame({"name": ["x", "x"], "value": ["n/a", None]})) == ""  # nothing numeric
