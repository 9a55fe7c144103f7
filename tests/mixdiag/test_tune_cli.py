"""``mixdiag tune`` end to end on a recorded run: frontier + one recommendation, --html, refusals; the Tune page."""
import json
import subprocess
import sys

import pytest

from mixdiag.cli import main
from mixdiag.engine.testbed.session import RunRequest, run_scenario

from helpers.tune_scenario import SCENARIO


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune_cli")
    (d / "s.toml").write_text(SCENARIO.format(policy="token_budget"))
    run_scenario(RunRequest(scenario=str(d / "s.toml"), out=d / "run"))
    return d / "run"


def test_tune_json_prints_frontier_and_one_recommendation(run_dir, capsys):
    assert main(["tune", str(run_dir), "--knob", "chunk_size=64,128,256", "--slo-ttft-p99", "2", "--json",
                 "--jobs", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    labels = [r["label"] for r in doc["settings"]]
    assert labels == ["chunk_size=64", "chunk_size=128", "chunk_size=256"]
    assert [r["label"] for r in doc["settings"] if r["current"]] == ["chunk_size=128"]
    assert doc["frontier"] and set(doc["frontier"]) <= set(labels)
    assert doc["recommendation"] in labels and doc["recommended"]["ttft_p99_s"] <= 2
    assert doc["cost_model"]["kind"] == "fitted" and doc["cost_model"]["context"].startswith("exact")
    assert doc["workload"]["quality"]["arrivals"] == "measured"
    # the chunk size changes the schedule: each setting its own step count and prediction
    assert len({(r["steps"], r["ttft_p99_s"]) for r in doc["settings"]}) == 3
    assert all(r["itl_p99_s"] > 0 and r["ttft_p99_s"] > 0 and r["throughput_tok_s"] > 0 for r in doc["settings"])
    assert set(doc["predicted_change"]) == {"itl_p99_s", "ttft_p99_s", "throughput_tok_s"}


def test_tune_html_writes_the_plot_and_never_overwrites(run_dir, tmp_path, capsys):
    out = tmp_path / "tune.html"
    assert main(["tune", str(run_dir), "--knob", "chunk_size=64,256", "--html", str(out), "-q", "--jobs", "1"]) == 0
    text = out.read_text()
    assert 'id="frontier"' in text and "Pareto frontier" in text and "<script" in text
    assert "Set chunk_size=" in capsys.readouterr().out or "No recommendation" in text
    assert main(["tune", str(run_dir), "--knob", "chunk_size=64", "--html", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


def test_tune_runs_without_importing_torch(run_dir):
    """The replay needs only the engine's schedulers and block pool (pure Python): a fresh interpreter
    runs the whole command - load, fit, replay, frontier - and torch never loads (issue 22 item 8)."""
    probe = ("import sys\nfrom mixdiag.cli import main\n"
             f"rc = main(['tune', {str(run_dir)!r}, '--knob', 'chunk_size=64,128', '--json', '-q', '--jobs', '1'])\n"
             "print('RESULT', rc, 'torch' in sys.modules, 'mixdiag.engine.core.kv_cache' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    # rc 0, no torch, and the block pool really was used (the path that used to pull torch ran)
    assert last == "RESULT 0 False True", (last, out.stderr[-2000:])


@pytest.mark.parametrize("args,msg", [
    (["--knob", "nope=1"], "--knob"),
    ([], "at least one --knob"),
    (["--knob", "chunk_size=64", "--slo-ttft-p99", "-1"], "SLOs must be positive"),
    (["--knob", "chunk_size=0"], "chunk_size=0"),
])
def test_tune_refuses_bad_input_in_one_line(run_dir, capsys, args, msg):
    assert main(["tune", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and msg in err and err.count("\n") == 1


def test_tune_page_figure_is_a_pure_builder():
    from mixdiag.dashboard.pages.frontier import frontier_figure

    rows = [{"label": f"chunk_size={c}", "setting": {"chunk_size": c}, "itl_p99_s": i, "ttft_p99_s": t,
             "throughput_tok_s": 1000.0, "pareto": p, "current": c == 512}
            for c, i, t, p in [(256, 0.05, 2.0, True), (512, 0.1, 1.5, True), (1024, 0.2, 1.6, False)]]
    res = {"settings": rows, "current": rows[1], "recommended": rows[0], "slo": {"ttft_p99_s": 2.5, "itl_p99_s": None}}
    fig = frontier_figure(res)
    names = [t.name for t in fig.data]
    assert names == ["settings", "Pareto frontier", "current", "recommended"]
    assert list(fig.data[1].x) == [50.0, 100.0]      # frontier only, in ms


def test_tune_page_is_linked_and_sweeps_the_loaded_run(run_dir):
    from mixdiag.dashboard.app import create_app
    from mixdiag.dashboard.pages import frontier as page
    from mixdiag.dashboard.settings import DashboardConfig

    app = create_app(DashboardConfig.from_data_path(run_dir))
    c = app.server.test_client()
    assert c.get("/").status_code == 200
    text = json.dumps(c.get("/_dash-layout").get_json())
    assert '"href": "/tune"' in text and '"children": "Tune"' in text
    ds = app.mixdiag_store.get(None)
    head, fig = page.on_sweep(app.mixdiag_store, {"id": ds.id}, "chunk_size=64,256", 2.0, None)
    assert head.startswith(("Set chunk_size=", "No recommendation")) and fig.data[0].name == "settings"
    head, fig = page.on_sweep(app.mixdiag_store, {"id": ds.id}, "bogus=1", None, None)
    assert head.startswith("error: --knob") and fig == {}


def test_tune_page_opens_on_a_default_sweep_then_on_the_last_one(run_dir):
    """First open: a sweep of the default knob (no empty axis); after a Sweep, reopening shows that
    sweep with its inputs, without sweeping again; another revision of the data is swept afresh."""
    from mixdiag.dashboard.app import create_app
    from mixdiag.dashboard.pages import frontier as page
    from mixdiag.dashboard.settings import DashboardConfig

    store = create_app(DashboardConfig.from_data_path(run_dir)).mixdiag_store
    key = {"id": store.get(None).id, "rev": 0}
    memory = page.SweepMemory()
    head, fig, knob, ttft, itl = page.on_open(store, key, memory)
    assert knob == page.DEFAULT_KNOB and (ttft, itl) == (None, None)
    assert head.startswith(("Set chunk_size=", "No recommendation")) and fig.data[0].name == "settings"
    # a point per default setting, plus the run's own chunk size (128) that the sweep always adds
    assert len(fig.data[0].x) == len(page.DEFAULT_KNOB.split(",")) + 1
    head2, fig2 = page.on_sweep(store, key, "chunk_size=64,128", 2.0, None, memory)
    assert page.on_open(store, key, memory) == (head2, fig2, "chunk_size=64,128", 2.0, None)
    assert memory.get({**key, "rev": 1}) is None
    # a failed sweep says why and leaves the last good one in place
    assert page.on_sweep(store, key, "bogus=1", None, None, memory)[0].startswith("error:")
    assert page.on_open(store, key, memory)[2] == "chunk_size=64,128"


def test_tune_page_mount_sweeps_and_the_button_sweeps_the_inputs(run_dir):
    """Through Dash's own dispatch: the callback's initial call (the page's mount) fills the figure;
    a click on Sweep runs the knob in the input and leaves the inputs alone."""
    from mixdiag.dashboard.app import create_app
    from mixdiag.dashboard.settings import DashboardConfig

    app = create_app(DashboardConfig.from_data_path(run_dir))
    c = app.server.test_client()
    c.get("/")
    key = {"id": app.mixdiag_store.get(None).id, "rev": 0}
    outs = [("tune-headline", "children"), ("tune-frontier-graph", "figure"), ("tune-knob", "value"),
            ("tune-slo-ttft", "value"), ("tune-slo-itl", "value")]

    def call(changed, knob):
        body = {"output": ".." + "...".join(f"{i}.{p}" for i, p in outs) + "..",
                "outputs": [{"id": i, "property": p} for i, p in outs],
                "inputs": [{"id": "tune-run-btn", "property": "n_clicks", "value": 1 if changed else 0},
                           {"id": "app-dataset-key", "property": "data", "value": key}],
                "state": [{"id": "tune-knob", "property": "value", "value": knob},
                          {"id": "tune-slo-ttft", "property": "value", "value": None},
                          {"id": "tune-slo-itl", "property": "value", "value": None}],
                "changedPropIds": ["tune-run-btn.n_clicks"] if changed else []}
        r = c.post("/_dash-update-component", json=body)
        assert r.status_code == 200, r.get_data(as_text=True)[:300]
        return r.get_json()["response"]

    mount = call(False, "chunk_size=64")  # the page's initial call: the default sweep, whatever the input says
    assert mount["tune-knob"]["value"] == "chunk_size=256,512,1024,2048"
    assert len(mount["tune-frontier-graph"]["figure"]["data"][0]["x"]) == 5  # 4 + the current 128
    click = call(True, "chunk_size=64,128")
    assert "tune-knob" not in click  # the inputs stay as the user typed them
    assert len(click["tune-frontier-graph"]["figure"]["data"][0]["x"]) == 2
