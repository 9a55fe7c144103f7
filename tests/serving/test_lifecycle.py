"""`mixdiag serve` as a process: SIGTERM drains open streams; the tokenizer ships and round-trips."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from tests.serving.conftest import write_scenario


def test_sigterm_drains_open_stream(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "mixdiag", "serve", "--scenario", str(write_scenario(tmp_path)),
                             "--port", "0", "--no-nvtx", "--drain-timeout", "20"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://\S+)", line)
        assert m, line
        url = m.group(1)
        body = {"model": "mixdiag-tiny", "prompt": [7] * 8, "max_tokens": 300, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        got: list[str] = []
        started = threading.Event()

        def consume():
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for ln in r.iter_lines():
                    if ln.startswith("data: "):
                        got.append(ln[6:])
                        started.set()

        th = threading.Thread(target=consume)
        th.start()
        assert started.wait(30)
        proc.send_signal(signal.SIGTERM)
        th.join(60)
        assert proc.wait(60) == 0
        assert got[-1] == "[DONE]"
        assert json.loads(got[-2])["usage"]["completion_tokens"] == 300
        assert sum(1 for g in got[:-2] if json.loads(g)["choices"]) == 300   # no token lost in the drain
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_shipped_tokenizer_is_a_fresh_deterministic_build(tmp_path):
    from mixdiag.engine.serving.tokenizer import SHIPPED_DIR, write_shipped

    write_shipped(tmp_path)
    assert (tmp_path / "tokenizer.json").read_text() == (SHIPPED_DIR / "tokenizer.json").read_text()


@pytest.mark.parametrize("text", ["", "Hello, world!", "héllo wörld 日本語 😀\n\ttabs", "x" * 300])
def test_tokenizer_round_trips(text):
    from mixdiag.engine.serving.tokenizer import TextTokenizer

    tok = TextTokenizer(model_vocab_size=1024)
    assert tok.decode(tok.encode(text)) == text
    dec = tok.decoder()
    streamed = "".join(dec.push([i]) for i in tok.encode(text)) + dec.push([], final=True)
    assert streamed == text


def test_incremental_decoder_matches_full_decode_on_random_ids():
    from mixdiag.engine.serving.tokenizer import TextTokenizer

    tok = TextTokenizer()
    rng = random.Random(3)
    for _ in range(20):
        ids = [rng.randrange(0, 1024) for _ in range(rng.randrange(1, 60))]
        dec = tok.decoder()
        out = "".join(dec.push([i]) for i in ids) + dec.push([], final=True)
        assert out == tok.decode(ids)


def test_tokenizer_refuses_a_vocabulary_larger_than_the_model():
    from mixdiag.engine.serving.tokenizer import TextTokenizer
    from mixdiag.errors import UserError

    with pytest.raises(UserError, match="do not fit"):
        TextTokenizer(model_vocab_size=100)


def test_help_does_not_import_torch_or_starlette():
    code = ("import sys; from mixdiag.cli import build_parser; build_parser(); "
            "print(any(m in sys.modules for m in ('torch', 'starlette', 'uvicorn', 'httpx')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    assert out.stdout.strip() == "False"


def test_expired_drain_ends_each_stream_with_an_error_event_and_one_log_line(tmp_path):
    # --drain-timeout 0: every stream still open at SIGTERM outlives the drain (500 tokens to go)
    proc = subprocess.Popen([sys.executable, "-m", "mixdiag", "serve", "--scenario", str(write_scenario(tmp_path)),
                             "--port", "0", "--no-nvtx", "--drain-timeout", "0"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    n = 4
    try:
        url = re.search(r"listening on (http://\S+)", proc.stderr.readline()).group(1)
        body = {"model": "mixdiag-tiny", "prompt": [7] * 8, "max_tokens": 500, "temperature": 0, "stream": True,
                "ignore_eos": True}
        got: list[list[str]] = [[] for _ in range(n)]
        started = [threading.Event() for _ in range(n)]

        def consume(i):
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for ln in r.iter_lines():
                    if ln.startswith("data: "):
                        got[i].append(ln[6:])
                        started[i].set()

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(n)]
        for th in threads:
            th.start()
        assert all(ev.wait(30) for ev in started)
        proc.send_signal(signal.SIGTERM)
        for th in threads:
            th.join(60)
        assert proc.wait(60) == 0
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for events in got:
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])["error"]
        assert "--drain-timeout" in last["message"] and last["type"] == "server_error"
        assert all("choices" in json.loads(e) for e in events[:-2])   # tokens until the cut
    cut = [ln for ln in err.splitlines() if "cut by --drain-timeout" in ln]
    assert len(cut) == n and len({ln.split()[2] for ln in cut}) == n, err
    assert "Traceback" not in err and "Cancel" not in err, err
