"""A real server on 127.0.0.1 (uvicorn in a thread, any free port) over a tiny engine."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

def _scenario(name: str, seed: int, header: str, layers: str, max_model_len: int, num_blocks: int, budget: int) -> str:
    """A one-group tiny-model scenario; the servers under test get their real workload over HTTP."""
    return f"""
name = "{name}"
seed = {seed}
{header}[model]
preset = "tiny"
{layers}max_model_len = {max_model_len}
[cache]
block_size = 16
num_blocks = {num_blocks}
[scheduler]
policy = "token_budget"
max_num_batched_tokens = {budget}
[engine]
num_threads = 1
[workload]
time_unit = "step"
[[workload.groups]]
name = "x"
count = 1
arrival = "burst"
start = 0
prompt_len = {{ dist = "fixed", value = 8 }}
output_len = {{ dist = "fixed", value = 8 }}
"""


TINY = _scenario("serve-test", 1, "max_steps = 10\n", "num_layers = 1\n", 512, 256, 128)


def write_scenario(d: Path) -> Path:
    p = d / "serve-test.toml"
    p.write_text(TINY)
    return p


class Running:
    def __init__(self, url, state, server, thread):
        self.url, self.state, self.server, self.thread = url, state, server, thread

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=5).json()

    def stop(self):
        self.server.should_exit = True
        self.thread.join(20)


def start(tmp: Path, **cfg) -> Running:
    from mixdiag.engine.serving.launch import ServeOptions, build_state
    from mixdiag.engine.serving.server import ServerConfig, bind, create_app, make_uvicorn
    from mixdiag.engine.telemetry.instrumentation import InstrumentationConfig

    scfg = ServerConfig(port=0, **cfg)
    state = build_state(ServeOptions(scenario=str(write_scenario(tmp))), scfg,
                        InstrumentationConfig(nvtx=False, final_scrape=False))
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = make_uvicorn(create_app(state), scfg)
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return Running(url, state, server, th)
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("server did not come up")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run = start(tmp_path_factory.mktemp("serve"))
    yield run
    run.stop()


# A mixing engine: long prompts chunked (256 tokens a step) into the steps of running decodes.
MIXING = _scenario("serve-mixing", 3, "", "", 4096, 1024, 256)


def start_mixing(tmp, dialect: str = "vllm"):
    """A server thread over the mixing engine writing scrapes (``dialect``) and truth to ``tmp/srv``."""
    from mixdiag.engine.serving.launch import ServeOptions, build_state
    from mixdiag.engine.serving.server import ServerConfig, bind, create_app, make_uvicorn
    from mixdiag.engine.telemetry.instrumentation import InstrumentationConfig

    sc = tmp / "serve-mixing.toml"
    sc.write_text(MIXING)
    scfg = ServerConfig(port=0)
    state = build_state(ServeOptions(scenario=str(sc), out_dir=str(tmp / "srv")), scfg,
                        InstrumentationConfig(nvtx=False, scrape_interval_s=1.0, metrics_dialect=dialect))
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = make_uvicorn(create_app(state), scfg)
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url, server, th
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("server did not come up")


@pytest.fixture
def mixing_server():
    """``start_mixing`` (a factory: tests choose the directory and the metrics dialect)."""
    return start_mixing
