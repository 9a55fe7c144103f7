"""The app factory: four Dash pages, /metrics on the same server carrying the report's spike counts."""
import io
import json
from contextlib import redirect_stdout

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mixdiag.cli import main as cli_main
from mixdiag.dashboard.app import create_app
from mixdiag.dashboard.settings import DashboardConfig
from mixdiag.errors import UserError


@pytest.fixture(scope="module")
def app(faulty_run):
    return create_app(DashboardConfig.from_data_path(faulty_run, upload_max_bytes=2**20))


def test_metrics_parse_and_carry_the_reports_spike_counts(app, faulty_run):
    r = app.server.test_client().get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=")
    counts = {s.labels["cause"]: int(s.value)
              for fam in text_string_to_metric_families(r.get_data(as_text=True)) if fam.name == "mixdiag_spikes"
              for s in fam.samples if s.name == "mixdiag_spikes_total"}
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["analyze", str(faulty_run), "--json"]) == 0
    report = json.loads(out.getvalue())
    assert counts == report["by_cause"]
    assert sum(counts.values()) == len(report["spikes"]) > 0
    assert len({s["cause"] for s in report["spikes"]}) >= 3


def test_frame_links_the_four_pages_and_holds_the_loaded_dataset(app):
    c = app.server.test_client()
    assert c.get("/").status_code == 200
    layout = c.get("/_dash-layout").get_json()
    text = json.dumps(layout)
    for label, href in (("Overview", "/"), ("Timeline", "/timeline"), ("Spike", "/spike"), ("Sources", "/sources")):
        assert f'"children": "{label}"' in text and f'"href": "{href}"' in text
    ds = app.mixdiag_store.get(None)
    assert f'"id": "{ds.id}"' in text


@pytest.mark.parametrize("path,ids", [
    ("/", ["overview-verdict", "overview-by-cause-graph"]),
    ("/timeline", ["timeline-instance", "timeline-graph"]),
    ("/spike", ["spike-choice", "spike-evidence"]),
    ("/sources", ["sources-data-choice", "sources-upload", "sources-status"]),
])
def test_each_page_renders_its_own_prefixed_components(app, path, ids):
    """The pages router (a Dash callback) returns the page of ``path``; its ids carry the page's prefix."""
    c = app.server.test_client()
    c.get("/")  # the router is set up on the first request
    body = {"output": ".._pages_content.children..._pages_store.data..",
            "outputs": [{"id": "_pages_content", "property": "children"}, {"id": "_pages_store", "property": "data"}],
            "inputs": [{"id": "_pages_location", "property": "pathname", "value": path},
                       {"id": "_pages_location", "property": "search", "value": ""}],
            "changedPropIds": ["_pages_location.pathname"], "state": []}
    r = c.post("/_dash-update-component", json=body)
    assert r.status_code == 200, r.get_data(as_text=True)[:300]
    text = r.get_data(as_text=True)
    for i in ids:
        assert f'"id":"{i}"' in text.replace(" ", "")
    prefix = path.strip("/") or "overview"
    page_ids = [x.split('"')[0] for x in text.replace(" ", "").split('"id":"')[1:]]
    assert page_ids and all(i.startswith(prefix + "-") for i in page_ids)


def test_upload_cap_applies_to_the_request(app):
    assert app.server.config["MAX_CONTENT_LENGTH"] == 2**20 * 4 // 3 + 2 * 2**20
    big = b"{" + b" " * (app.server.config["MAX_CONTENT_LENGTH"] + 10) + b"}"
    r = app.server.test_client().post("/_dash-update-component", data=big, content_type="application/json")
    assert r.status_code == 413


def test_a_bad_initial_path_is_a_user_error(tmp_path):
    (tmp_path / "x.log").write_text("nothing a collector knows\n")
    with pytest.raises(UserError):
        create_app(DashboardConfig.from_data_path(tmp_path / "x.log"))
