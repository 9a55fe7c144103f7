"""``mixdiag nvml-sample`` on a machine without NVML: one-line error, exit 2, no file left behind."""
import sys

from mixdiag.cli import main


def test_without_nvidia_ml_py_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    out = tmp_path / "s.csv"
    assert main(["nvml-sample", "--out", str(out), "--duration", "0.1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "nvidia-ml-py" in err and "\n" not in err
    assert not out.exists()


def test_bad_interval(tmp_path, capsys):
    assert main(["nvml-sample", "--out", str(tmp_path / "s.csv"), "--interval", "0"]) == 2
    assert "positive" in capsys.readouterr().err


def test_writes_the_csv_with_a_stand_in_for_nvml(tmp_path, capsys, monkeypatch):
    """The GPU part (pynvml) is a stand-in here: this machine has no GPU or driver."""
    import json
    import types

    utils = iter([20, 60, 40])
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: ("h", i), nvmlDeviceGetUUID=lambda h: "GPU-x",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=next(utils), memory=0))
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # no nvmlGpmQueryDeviceSupport: utilization
    out = tmp_path / "s.csv"
    assert main(["nvml-sample", "--out", str(out), "--interval", "0.1", "--duration", "0.3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["samples"] == 3 and doc["metric"] == "gpu_util" and doc["quality"] == "estimated"
    assert abs(doc["mean"] - 0.4) < 1e-9 and doc["max"] == 0.6
    assert out.read_text().splitlines()[0] == "t_s,gpu_index,gpu_uuid,metric,value"
    assert main(["nvml-sample", "--out", str(out)]) == 2  # never overwrites
