"""Every input issue 22 names, rebuilt and run through the CLI: what each gives now (exit code, first
line of output). The issue's acceptance asks the note to list them; this prints that list so anyone
can check it on their build (regression tests for each case live in tests/, this is the user's view).

    .venv/bin/python scripts/inputs_tried.py [--markdown]

Inputs are written to a temporary folder (the repo's fixtures are only read). Each command runs in
a child process, as a user would run it; nothing here times anything.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
T0 = 1796141800.0  # an epoch clock (2026-12): the one that made prefix sums cancel


def client_capture(path: Path, seconds: float = 180.0, streams: int = 12) -> None:
    """A 3-minute client capture in the load-records format: 12 streams decoding every ~12 ms with a
    ~150 ms mixed step every ~0.4 s (the shape that gave > 1000 spikes and the OverflowError)."""
    rng = random.Random(7)
    t, steps = T0, []
    while t < T0 + seconds:
        t += 0.15 if rng.random() < 0.03 else 0.012 + rng.random() * 0.002
        steps.append(t)
    head = {"type": "header", "format": "mixdiag-load", "version": 1, "model": "m", "clock": "unix",
            "started_s": T0, "duration_s": seconds, "streams": ["base"]}
    lines = [json.dumps(head)]
    per = len(steps) // streams
    for s in range(streams):
        times = steps[s * per // 4: s * per // 4 + per * 3]  # overlapping streams
        lines.append(json.dumps({"type": "request", "request_id": f"base:{s}", "scheduled_s": times[0] - 0.05,
                                 "start_s": times[0] - 0.05, "prompt_tokens": 64, "max_tokens": len(times),
                                 "status": "ok", "error": None, "ttft_s": 0.05, "token_times_s": times}))
    path.write_text("\n".join(lines) + "\n")


def vllm_scrape(i: int, cut: bool = False) -> str:
    """One vLLM V1 `/metrics` body after ``i`` seconds of steady traffic."""
    lab = 'engine="0",model_name="m"'
    out = [f"vllm:prompt_tokens_total{{{lab}}} {400 * i}", f"vllm:generation_tokens_total{{{lab}}} {80 * i}",
           f"vllm:num_requests_running{{{lab}}} 8", f"vllm:num_requests_waiting{{{lab}}} 0"]
    for le, c in (("0.01", 20), ("0.05", 70), ("0.1", 78), ("+Inf", 80)):
        out.append(f'vllm:inter_token_latency_seconds_bucket{{{lab},le="{le}"}} {c * i}')
    out += [f"vllm:inter_token_latency_seconds_count{{{lab}}} {80 * i}",
            f"vllm:inter_token_latency_seconds_sum{{{lab}}} {round(1.6 * i + 2.0 * (i // 37), 3)}"]
    text = "\n".join(out) + "\n"
    return text[: text.index('le="0.1"')].rsplit("\n", 1)[0] + "\n" if cut else text


def stats_log(n: int, bad_every: int, byte: bytes = b"\xe9") -> bytes:
    """A vLLM operator log of ``n`` stats lines (a KV-usage peak in the middle), ``byte`` (not UTF-8) put
    twice on every ``bad_every``-th line (0: none). tests/collectors/test_partial_reads.py reads the same."""
    out = []
    for i in range(n):
        s = 10 * (i + 1)
        kv = 97.0 if i == n // 2 else 40.0
        line = (f"(APIServer pid=1) INFO 03-17 15:{s // 60:02d}:{s % 60:02d} [loggers.py:259] Engine 000: Avg prompt "
                f"throughput: 100.0 tokens/s, Avg generation throughput: 50.0 tokens/s, Running: 5 reqs, Waiting: 0 "
                f"reqs, GPU KV cache usage: {kv}%, Prefix cache hit rate: 0.0%").encode()
        if bad_every and i % bad_every == 0:
            line = line.replace(b"Running", b"Running" + byte).replace(b"[loggers", byte + b"[loggers")
        out.append(line)
    return b"\n".join(out) + b"\n"


def build(d: Path) -> list[tuple[str, list[str]]]:
    """(what the issue said, argv after `mixdiag`) for every input, written under ``d``."""
    cases = []
    client_capture(d / "client.jsonl")
    cases.append(("3-minute client capture, > 1000 spikes (was OverflowError)", ["analyze", str(d / "client.jsonl")]))
    sc = d / "scrapes_epoch"
    sc.mkdir()
    for i in range(1, 601):
        (sc / f"{T0 + i:.3f}.prom").write_text(vllm_scrape(i))
    cases.append(("10 minutes of 1 s vLLM scrapes on an epoch clock (was: negative prefill_work_tokens)",
                  ["analyze", str(sc)]))
    whole = d / "metrics_whole.txt"
    whole.write_text(vllm_scrape(50))
    cut = d / "metrics_cut.txt"
    cut.write_text(vllm_scrape(50, cut=True))
    cases.append(("a /metrics dump cut in half (was: summary, no warning)", ["analyze", str(cut)]))
    cases.append(("the same dump cut in half, --strict", ["analyze", str(cut), "--strict"]))
    gd = d / "scrapes_garbage"
    gd.mkdir()
    for i in range(1, 40):
        (gd / f"{T0 + 10 * i:.3f}.prom").write_text(vllm_scrape(10 * i))
    (gd / f"{T0 + 400:.3f}.prom").write_bytes(bytes(random.Random(1).randrange(256) for _ in range(2000)))
    cases.append(("a scrape directory with one garbage file (was: skipped without a word)", ["analyze", str(gd)]))
    for every, what in ((7, "some"), (1, "every")):
        p = d / f"stats_latin1_{what}.log"
        p.write_bytes(stats_log(59, every))
        cases.append((f"latin-1 bytes on {what} vLLM stats line (was: 9 / all 59 intervals dropped)",
                      ["analyze", str(p)]))
    cases.append(("one /metrics dump (was: 'No TPOT spikes found in 1 intervals')", ["analyze", str(whole)]))
    frag = d / "fragment_7_5.txt"
    frag.write_text("".join(f'vllm:inter_token_latency_seconds_bucket{{le="{le}",model_name="m"}} {c}\n'
                            for le, c in (("7.5", 90.0), ("10.0", 95.0), ("20.0", 97.0), ("+Inf", 100.0)))
                    + 'vllm:inter_token_latency_seconds_count{model_name="m"} 100.0\n'
                    + 'vllm:inter_token_latency_seconds_sum{model_name="m"} 600.0\n')
    cases.append(('a fragment whose lowest bucket is le="7.5" (was: ITL P50 3.75 s)', ["analyze", str(frag)]))
    eplb = d / "dp1_debug.log"
    eplb.write_text("".join(
        f"(EngineCore_DP1 pid=2010410) INFO 12-22 21:44:{s:02d} [eplb_state.py:731] EPLB step: avg_tokens=812.50, "
        f"max_tokens=1400, balancedness=0.5804\n"
        f"(EngineCore_DP1 pid=2010410) INFO 12-22 21:44:{s:02d} [nixl_connector.py:2115] KV Transfer metrics: "
        f"KVConnectorType: NixlConnector, Num successful transfers=3, Avg xfer time (ms)=12.5, P90 xfer time "
        f"(ms)=20.1, Avg MB per transfer=64.0\n" for s in range(20)))
    cases.append(("a DP engine's log of only EPLB and KV-transfer lines (was: 'file in no known format')",
                  ["analyze", str(eplb)]))
    dbg = d / "dp1_only_debug.log"
    dbg.write_text("".join(f"(EngineCore_DP1 pid=2010410) DEBUG 12-22 21:44:{s:02d} [core.py:412] EngineCore "
                           f"waiting for work.\n" for s in range(20)))
    cases.append(("a DP engine's log of only DEBUG lines", ["analyze", str(dbg)]))
    junk = d / "notes.txt"
    junk.write_text("nothing an engine wrote\n")
    cases.append(("a file in no known format", ["analyze", str(junk)]))
    cases.append(("a path that does not exist", ["analyze", str(d / "missing.log")]))
    run = d / "tune_run"
    shutil.copytree(FIX / "vllm032" / "tune", run)
    cases.append(("`mixdiag tune` on a real-vLLM client capture (was: imports torch)",
                  ["tune", str(run / "client.jsonl"), "--knob", "chunk_size=256,512", "--current", "chunk_size=512"]))
    return cases


def first_line(text: str) -> str:
    for ln in text.splitlines():
        if ln.strip():
            return ln.strip()[:160]
    return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a markdown table (the note's form)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mixdiag-inputs-") as tmp:
        for what, argv in build(Path(tmp)):
            p = subprocess.run([sys.executable, "-m", "mixdiag", *argv], capture_output=True, text=True, cwd=ROOT)
            out, err = first_line(p.stdout), first_line(p.stderr)
            tb = "Traceback" in p.stderr
            rows.append((what, p.returncode, out, err, tb))
    if a.markdown:
        print("| input | exit | first line of stdout | first line of stderr |\n|---|---|---|---|")
        for what, rc, out, err, tb in rows:
            print(f"| {what} | {rc}{' (traceback!)' if tb else ''} | {out.replace('|', '/')} | {err.replace('|', '/')} |")
    else:
        for what, rc, out, err, tb in rows:
            print(f"{what}\n  exit {rc}{'  TRACEBACK' if tb else ''}\n  stdout: {out}\n  stderr: {err}")
    return 1 if any(r[4] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
