"""Engine-run collector: run directories as the engine saves them (equal to the engine's in-process records)."""
import pytest

from mixdiag.collectors import engine_run
from mixdiag.engine.core.records import StepRecord, TokenEvent, to_timeline
from mixdiag.errors import UserError


def _records(t0=1_800_000_000.0):
    return [StepRecord(step=0, t_start_s=t0, t_end_s=t0 + 0.05, kind="prefill", prefill_tokens=64, prefill_reqs=1,
                       token_events=[TokenEvent("r0", t0 + 0.05, 1, True)], num_scheduled_tokens={"r0": 64}),
            StepRecord(step=1, t_start_s=t0 + 0.06, t_end_s=t0 + 0.07, kind="mixed", prefill_tokens=32,
                       prefill_reqs=1, decode_reqs=1, decode_rows=1, graph_mode="PIECEWISE",
                       token_events=[TokenEvent("r0", t0 + 0.07, 1, False)], num_scheduled_tokens={"r0": 1, "r1": 32}),
            StepRecord(step=2, t_start_s=t0 + 0.08, t_end_s=t0 + 0.085, kind="decode", decode_reqs=2, decode_rows=2,
                       graph_mode="FULL", token_events=[TokenEvent("r0", t0 + 0.085, 1, False),
                                                        TokenEvent("r1", t0 + 0.085, 1, True)])]


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    to_timeline(_records(), meta={"scenario": "unit", "seed": 1}).save(d)
    (d / "truth.csv").write_text("instance,step,cause\nengine0,1,mixing\n")
    (d / "engine.log").write_text("")
    return d


def test_run_directory_reads_back_what_the_engine_saved(run_dir):
    tl = engine_run.read(run_dir)
    assert tl.instances == ["engine0"] and list(tl.steps["kind"]) == ["prefill", "mixed", "decode"]
    assert len(tl.tokens) == 4 and tl.meta["scenario"] == "unit"
    src = tl.meta["sources"][-1]
    assert src["format"] == "mixdiag-run" and src["lines_parsed"] == 3 + 4 and not src["partial"]
    assert any("engine.log" in n for n in src["notes"])
    assert "truth" not in repr(tl.meta)  # ground truth is never read into the Timeline


def test_in_process_records_equal_the_saved_run(run_dir):
    a = to_timeline(_records())  # the engine's own converter; collectors never import the engine
    b = engine_run.read(run_dir)
    assert a.steps.equals(b.steps) and a.tokens.equals(b.tokens)


def test_instance_option_renames(run_dir):
    tl = engine_run.read(run_dir, instance="east-1")
    assert tl.instances == ["east-1"] and set(tl.meta["signals"]) == {"east-1"}


def test_missing_frame_is_partial(run_dir):
    (run_dir / "tokens.parquet").unlink()
    tl = engine_run.read(run_dir)
    assert tl.meta["partial"] is True and tl.meta["sources"][-1]["partial"] is True


@pytest.mark.parametrize("damage,message", [
    (lambda d: (d / "steps.parquet").write_bytes(b"PAR1 cut"), "damaged run directory"),
    (lambda d: (d / "meta.json").write_text('{"clock": "unix", '), "damaged run directory"),
])
def test_damaged_run_is_one_line_user_error(run_dir, damage, message):
    damage(run_dir)
    with pytest.raises(UserError, match=message):
        engine_run.read(run_dir)


def test_sniff_wants_timeline_files(run_dir, tmp_path):
    assert engine_run.sniff(b"", str(run_dir)) and not engine_run.sniff(b"", str(tmp_path / "nothing"))


def test_is_run_dir_needs_a_directory_with_any_timeline_file(run_dir, tmp_path):
    assert engine_run.is_run_dir(run_dir) and engine_run.is_run_dir(str(run_dir))
    only_meta = tmp_path / "only_meta"
    only_meta.mkdir()
    assert not engine_run.is_run_dir(only_meta)          # empty directory
    (only_meta / "meta.json").write_text("{}")
    assert engine_run.is_run_dir(only_meta)              # any one Timeline file makes it a (partial) run
    assert not engine_run.is_run_dir(only_meta / "meta.json")  # a file is never a run directory
