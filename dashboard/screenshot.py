"""Serve the app in a background thread and take a screenshot in headless Chromium.

``python -m mixdiag.dashboard.screenshot --data runs/demo --out docs/screenshot.png`` makes the
README's picture from the real app. Needs the test extra (selenium) and Debian ``chromium`` +
``chromium-driver``.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
#: Chromium flags: headless, no sandbox/GPU (containers), and nothing that phones home.
CHROME_ARGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", "--disable-extensions")


class ThreadedServer:
    """The app's Flask server on 127.0.0.1 and a free port, in a daemon thread, until :meth:`stop`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        from werkzeug.serving import make_server

        self._srv = make_server(host, port, app.server, threaded=True)
        self.url = f"http://{host}:{self._srv.server_port}/"
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(timeout=5)


def chrome_options(width: int = 1400, height: int = 1800):
    from selenium.webdriver.chrome.options import Options

    opts = Options()
    for a in CHROME_ARGS + (f"--window-size={width},{height}",):
        opts.add_argument(a)
    if Path(CHROMIUM).exists():
        opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return opts


def chrome(options=None):
    """A headless Chromium WebDriver using /usr/bin/chromedriver when present."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = options or chrome_options()
    if Path(CHROMEDRIVER).exists():
        return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    return webdriver.Chrome(options=options)


def capture(app, out: Path, tab: str = "Timeline", wait_s: float = 30.0) -> Path:
    """Open ``app`` on ``tab`` and save a PNG of the page to ``out``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    srv = ThreadedServer(app)
    driver = chrome(chrome_options(1400, 700))  # small first: the page's scrollHeight is at least the window
    try:
        driver.get(srv.url)
        wait = WebDriverWait(driver, wait_s)
        wait.until(EC.text_to_be_present_in_element((By.ID, "overview-verdict"), "spike"))
        if tab != "Overview":
            driver.find_element(By.XPATH, f"//a[contains(@class,'nav-tab') and normalize-space()='{tab}']").click()
            wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline-graph .scatterlayer .trace")))
        time.sleep(2.0)  # let plotly finish laying out
        # Size the window to the whole page so the screenshot holds every panel.
        height = driver.execute_script("return Math.max(document.documentElement.scrollHeight, "
                                       "document.body.scrollHeight)")
        inner = driver.execute_script("return window.innerHeight")
        outer = driver.get_window_size()["height"]
        driver.set_window_size(1400, min(int(height) + (outer - int(inner)) + 10, 2400))
        time.sleep(1.0)
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
        srv.stop()
    return out


def main(argv=None) -> int:
    from mixdiag.dashboard.app import create_app
    from mixdiag.dashboard.settings import DashboardConfig

    p = argparse.ArgumentParser(prog="python -m mixdiag.dashboard.screenshot", description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="run directory to show")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--tab", default="Timeline", choices=["Overview", "Timeline"])
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    a = p.parse_args(argv)
    out = Path(a.out)
    if out.exists() and not a.overwrite:
        sys.stderr.write(f"error: {out} exists; pass --overwrite to replace it\n")
        return 2
    capture(create_app(DashboardConfig.from_data_path(a.data)), out, tab=a.tab)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
