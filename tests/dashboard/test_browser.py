"""The dashboard in headless Chromium: load a run, four panels and spike markers, click a spike, across pages.

One app and one browser for the whole module (starting Chromium costs seconds on 2 cores).
"""
import pytest

pytestmark = pytest.mark.browser

selenium = pytest.importorskip("selenium", reason="the test extra (dash[testing]) provides selenium")
from selenium.webdriver import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from mixdiag.dashboard.app import create_app  # noqa: E402
from mixdiag.dashboard.settings import DashboardConfig  # noqa: E402
from mixdiag.dashboard.figures import PANEL_TITLES  # noqa: E402
from mixdiag.dashboard.pages import timeline  # noqa: E402
from mixdiag.dashboard.screenshot import ThreadedServer, chrome, chrome_options  # noqa: E402


@pytest.fixture(scope="module")
def session(faulty_run):
    app = create_app(DashboardConfig.from_data_path(faulty_run.parent))
    srv = ThreadedServer(app)
    driver = chrome(chrome_options(1400, 1800))
    try:
        yield app, srv, driver, WebDriverWait(driver, 40)
    finally:
        driver.quit()
        srv.stop()


def tab(driver, name):
    """Follow a page's link once the app has rendered it (Dash renders after its scripts load)."""
    xpath = f"//a[contains(@class,'nav-tab') and normalize-space()='{name}']"
    WebDriverWait(driver, 40).until(EC.element_to_be_clickable((By.XPATH, xpath))).click()


def test_load_a_run_see_four_panels_and_spike_markers_click_a_spike(session):
    app, srv, driver, wait = session
    driver.get(srv.url)
    # Sources page: pick the run and load it (the data directory holds it as run1/)
    tab(driver, "Sources")
    wait.until(EC.element_to_be_clickable((By.ID, "sources-data-choice"))).click()
    option = wait.until(EC.element_to_be_clickable((By.XPATH, "//*[contains(text(),'run: run1/')]")))
    option.click()
    driver.find_element(By.ID, "sources-load-btn").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "sources-status"), "loaded run1"))
    ds = app.mixdiag_store.get(None)
    d = ds.diagnosis

    tab(driver, "Overview")
    wait.until(EC.text_to_be_present_in_element((By.ID, "overview-verdict"), d.verdict[:40]))
    assert driver.find_element(By.ID, "overview-stat-spikes").text == str(len(d.spikes))

    tab(driver, "Timeline")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline-graph .scatterlayer .trace")))
    titles = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#timeline-graph .annotation-text")]
    for p in ("itl", "alloc", "sm", "graph"):
        assert PANEL_TITLES[p] in titles
    markers = driver.find_elements(By.CSS_SELECTOR, "#timeline-graph .scatterlayer .trace.scatter path.point")
    # spike markers are the diamond points (graph-mode ticks are points too, but not diamonds)
    legend = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#timeline-graph .legendtext")]
    causes = sorted(c for c, n in d.by_cause.items() if n)
    assert sorted(t.split(": ")[1] for t in legend if t.startswith("spike: ")) == causes
    assert len(markers) >= len(d.spikes)

    # click the EP-hotspot spike's marker
    target = d.spikes[d.spikes["cause"] == "ep_hotspot"].iloc[0]
    trace_idx = [i for i, e in enumerate(driver.execute_script(
        "return document.getElementById('timeline-graph').querySelector('.js-plotly-plot').data.map(t => t.name)"))
        if e == "spike: ep_hotspot"][0]
    point = driver.find_elements(By.CSS_SELECTOR, "#timeline-graph .scatterlayer .trace")[trace_idx] \
        .find_elements(By.CSS_SELECTOR, "path.point")[0]
    ActionChains(driver).move_to_element(point).pause(0.3).click().perform()
    wait.until(EC.text_to_be_present_in_element((By.ID, "spike-cause"), "ep_hotspot"))
    assert driver.current_url.rstrip("/").endswith("/spike")  # the click opened the Spike page
    assert f"step {int(target['step'])}" in driver.find_element(By.ID, "spike-cause").text
    evidence = driver.find_element(By.ID, "spike-evidence-table").text
    assert "expert_imbalance" in evidence and "4" in evidence
    assert driver.find_elements(By.CSS_SELECTOR, "#spike-neighbours-table tbody tr")
    assert "predicted height" in driver.find_element(By.ID, "spike-heights").text


def test_zoom_on_one_panel_zooms_all_and_resamples(session):
    app, srv, driver, wait = session
    tab(driver, "Timeline")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline-graph .scatterlayer .trace")))
    gd = "document.querySelector('#timeline-graph .js-plotly-plot')"
    driver.execute_script(f"Plotly.relayout({gd}, {{'xaxis.range': [1.0, 2.0]}})")  # zoom the top panel

    def resampled(drv):
        xs = drv.execute_script(f"return Array.from({gd}._fullData.find(t => t.name === 'ITL').x)")
        return xs if xs and min(xs[1:-1]) >= 1.0 and max(xs[1:-1]) <= 2.0 else False

    xs = wait.until(resampled)  # the server sent only the visible window
    ranges = driver.execute_script(
        f"const l = {gd}._fullLayout; return [1, 2, 3, 4].map(i => l['xaxis' + (i > 1 ? i : '')].range)")
    for r in ranges:
        assert r == pytest.approx([1.0, 2.0])
    full = timeline.view(app.mixdiag_store.get(None), "engine0").itl
    assert len(xs) < len(full)


def test_upload_a_capture_in_the_browser(session):
    from pathlib import Path

    app, srv, driver, wait = session
    log = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "vllm_log_31193.txt"  # real vLLM lines
    tab(driver, "Sources")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#sources-upload input[type=file]"))).send_keys(str(log))
    wait.until(EC.text_to_be_present_in_element((By.ID, "sources-status"), f"loaded upload: {log.name}"))
    ds = app.mixdiag_store.get(None)
    assert ds.label == f"upload: {log.name}" and ds.timeline.meta["sources"][0]["format"] == "vllm-log"
    tab(driver, "Overview")
    wait.until(EC.text_to_be_present_in_element((By.ID, "overview-verdict"), ds.diagnosis.verdict[:30]))


def test_browser_console_log_is_empty(session):
    _, _, driver, _ = session
    assert driver.get_log("browser") == []
