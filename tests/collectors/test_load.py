"""collectors.load: one or several inputs on one clock, directories, instance names, bad input."""
import shutil
from pathlib import Path

import pytest

from mixdiag.collectors import load
from mixdiag.collectors.traces.nsys import reader as nsys
from mixdiag.engine.core.records import StepRecord, to_timeline
from mixdiag.errors import UserError

NSYS = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"


def _run(d, t0):
    recs = [StepRecord(step=i, t_start_s=t0 + i, t_end_s=t0 + i + 0.5, kind="decode", decode_reqs=1, decode_rows=1)
            for i in range(3)]
    to_timeline(recs).save(d)
    return d


def test_single_input_is_the_collectors_own_result():
    a, b = load(NSYS / "mock.sqlite"), nsys.read(NSYS / "mock.sqlite")
    assert a.steps.equals(b.steps) and a.meta == b.meta


def test_several_inputs_align_on_one_clock():
    tl = load([NSYS / "h100_2gpu_1s.sqlite", NSYS / "mfu_2gpu_before.sqlite"])
    assert len(tl.instances) == 4 and len(tl.meta["sources"]) == 2
    assert tl.steps["gpu_kernels"].sum() == 3442 + 4010


def test_clashing_instance_names_are_kept_apart(tmp_path):
    tl = load([_run(tmp_path / "east", 1.8e9), _run(tmp_path / "west", 1.8e9 + 10)])
    assert tl.instances == ["engine0@east", "engine0@west"]
    assert set(tl.meta["signals"]) == {"engine0@east", "engine0@west"}


def test_different_clocks_cannot_be_combined():
    with pytest.raises(UserError, match="cannot be aligned on one clock"):
        load([NSYS / "mock.sqlite", NSYS / "healthy_1pct.sqlite"])


def test_directory_not_claimed_whole_reads_its_readable_files(tmp_path):
    shutil.copy(NSYS / "mock.sqlite", tmp_path / "mock.sqlite")
    (tmp_path / "README").write_bytes(bytes(range(200)))
    tl = load(tmp_path)
    assert tl.instances == ["mock"] and tl.meta["inputs_ignored"] == [str(tmp_path / "README")]


def test_directory_with_nothing_readable(tmp_path):
    (tmp_path / "junk.bin").write_bytes(bytes(range(200)))
    with pytest.raises(UserError, match="nothing readable"):
        load(tmp_path)


def test_forced_format_and_instance(tmp_path):
    tl = load(NSYS / "mock.sqlite", format="nsys-sqlite", instance="gpu7")
    assert tl.instances == ["gpu7"]
    with pytest.raises(UserError, match="single input"):
        load([NSYS / "mock.sqlite", NSYS / "h100_2gpu_1s.sqlite"], instance="x")
    with pytest.raises(UserError, match="not an SQLite file"):
        load(NSYS / "SOURCES.md", format="nsys-sqlite")


def test_sm_activity_source_fills_the_steps_of_the_others(tmp_path):
    run = _run(tmp_path / "run", 1.8e9)
    csv = tmp_path / "nvml.csv"
    csv.write_text("t_s,gpu_index,gpu_uuid,metric,value\n"
                   "1800000000.2,0,GPU-1,gpm_sm_util,0.2\n1800000000.4,0,GPU-1,gpm_sm_util,0.4\n"
                   "1800000002.3,0,GPU-1,gpm_sm_util,0.9\n")
    tl = load([run, csv])
    assert list(tl.steps["instance"].unique()) == ["engine0"] and len(tl.series) == 3
    sm = tl.steps["sm_active"]  # how samples map onto a step is the NVML collector's rule
    assert sm.notna().any() and sm.dropna().between(0.2 - 1e-6, 0.9 + 1e-6).all()
    assert tl.meta["signals"]["engine0"]["sm_active"] == "measured"
    assert [s["format"] for s in tl.meta["sources"]][-1] == "nvml-csv"
