"""mixdiag beside the peer analyzers (nsys-ai, HTA) on the same files: cost, coverage, and the peers' failures.

Each tool does its own job on each input, in a fresh process, best of ``--repeat`` (wall, CPU = user+sys
of the child from ``os.wait4``, peak RSS of the child and what it waited for); repeats interleave the tools
so machine load hits them alike. On a loaded machine trust the CPU column.

* an Nsight SQLite export of ``--kernels`` kernel rows (a 2-rank EP engine, tests/helpers/foreign_trace),
  and the real exports in tests/fixtures/nsys: ``mixdiag analyze --json`` against nsys-ai ``diagnose``
  (cold: the first run on a fresh copy, which builds its Parquet cache; warm: best of the later runs);
* a 2-rank PyTorch-profiler (Kineto) trace of ``--kineto-steps`` steps and a CPU-only trace recorded from
  the reference engine (``mixdiag run --profile``): ``mixdiag analyze`` against HTA's temporal, kernel,
  idle-time and communication breakdowns (+ memory bandwidth, stragglers; benchmarks/peers_hta_probe.py).

Peers run on copies (nsys-ai writes beside, and without its DuckDB extension into, the export it reads);
mixdiag runs on the originals, checked byte-identical afterwards. Peer venvs: benchmarks/peers_env.py.
Second table: which peer summaries mixdiag also gives, computed from its ``analyze --json`` keys
(benchmarks/peers_caps.py). Third: what went wrong in the peers (and in mixdiag), as observed.

    .venv/bin/python benchmarks/bench_peers.py [--repeat 3] [--kernels 2550000] [--no-install] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers_caps  # noqa: E402
import peers_env  # noqa: E402
from peers_inputs import (big_export, copy_fresh, cpu_trace, kineto_trace, sha256, sqlite_indexes,  # noqa: E402
                          written_beside)

ROOT = peers_env.ROOT
WORK = peers_env.CACHE / "work"
FIXTURES = ROOT / "tests" / "fixtures" / "nsys"
HTA_PROBE = Path(__file__).resolve().parent / "peers_hta_probe.py"
TARGET_CPU = 0.5  # issue 25: mixdiag analyze (with the breakdown) <= 0.5x the peer's CPU on its own job


@dataclass
class Run:
    rc: int
    wall_s: float
    cpu_s: float
    rss_bytes: int
    out: Path
    err_tail: str


@dataclass
class Row:
    input: str
    tool: str
    job: str
    runs: list[Run] = field(default_factory=list)
    ratio_to: str | None = None  # label of the mixdiag row a peer row is compared with

    def ok(self) -> list[Run]:
        return [r for r in self.runs if r.rc == 0]

    def best(self) -> dict | None:
        ok = self.ok()
        if not ok:
            return None
        return {"wall_s": min(r.wall_s for r in ok), "cpu_s": min(r.cpu_s for r in ok),
                "rss_bytes": max(r.rss_bytes for r in ok), "n": len(ok)}


def measure(cmd: list[str], out: Path, *, cwd: Path = ROOT, env=None, timeout: int = 900) -> Run:
    """Run ``cmd`` with stdout to ``out``; wall, CPU and peak RSS of the child (and what it reaped)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    err = out.with_suffix(".err")
    t0 = time.perf_counter()
    with open(out, "wb") as fo, open(err, "wb") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, cwd=cwd, env=env, start_new_session=True)
        timer = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
        timer.start()
        _, status, ru = os.wait4(p.pid, 0)
        timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    lines = [ln for ln in err.read_text(errors="replace").splitlines() if ln.strip()]
    tail = lines[-1].strip()[:240] if lines else ""
    if p.returncode in (-9, 137) and wall >= timeout:
        tail = f"killed after the {timeout} s timeout"
    return Run(p.returncode, wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024, out, tail)


class Bench:
    def __init__(self, args, say):
        self.args, self.say = args, say
        self.rows: list[Row] = []
        self.observed: list[dict] = []
        self.docs: list[dict] = []
        self.doc_paths: list[tuple[str, Path]] = []
        self.identical: dict[str, bool] = {}
        self.peers = {n: peers_env.ensure(p, install=not args.no_install) for n, p in peers_env.peers().items()}
        help_text = subprocess.run([sys.executable, "-m", "mixdiag", "analyze", "--help"], capture_output=True,
                                   text=True, cwd=ROOT).stdout
        self.no_breakdown_flag = "--no-breakdown" in help_text
        self.diff_available = subprocess.run([sys.executable, "-m", "mixdiag", "diff", "--help"], capture_output=True,
                                             cwd=ROOT).returncode == 0

    def observe(self, tool: str, inp: str, what: str) -> None:
        self.observed.append({"tool": tool, "input": inp, "observed": what})

    def mixdiag_row(self, label: str, job: str = "analyze --json") -> Row:
        row = Row(label, "mixdiag", job)
        self.rows.append(row)
        return row

    def run_mixdiag(self, row: Row, files: list[Path], rep: int, extra=()) -> None:
        out = WORK / "mixdiag" / f"{row.input}{'-'.join(['', *extra])}.{rep}.json"
        r = measure([sys.executable, "-m", "mixdiag", "analyze", *map(str, files), "--json", "-q", *extra], out,
                    timeout=self.args.timeout)
        row.runs.append(r)
        if r.rc != 0 and rep == 0:
            self.observe("mixdiag", row.input, f"analyze exit {r.rc}: {r.err_tail}")
        if r.rc == 0 and rep == 0 and not extra:
            self.doc_paths.append((row.input, out))  # parsed after all runs: keeps this process small

    def load_docs(self) -> None:
        for label, path in self.doc_paths:
            try:
                self.docs.append(json.loads(path.read_text()))
            except ValueError as e:
                self.observe("mixdiag", label, f"--json output not JSON: {e}")

    def nsys_input(self, label: str, export: Path) -> None:
        """mixdiag and nsys-ai diagnose on one export, repeats interleaved."""
        before = sha256([export])
        mrow = self.mixdiag_row(label)
        nb = self.mixdiag_row(label, job="analyze --json --no-breakdown") if (
            self.no_breakdown_flag and label.startswith("ep2")) else None
        peer = self.peers["nsys-ai"]
        cold = Row(label, "nsys-ai", "diagnose (cold: builds its cache)", ratio_to="analyze --json")
        warm = Row(label, "nsys-ai", f"diagnose (warm, best of {self.args.repeat})", ratio_to="analyze --json")
        if peer.ready:
            self.rows += [cold, warm]
            folder = WORK / "nsys-ai" / label
            (copy,) = copy_fresh([export], folder)
            size0, idx0, listing = copy.stat().st_size, sqlite_indexes(copy), set(os.listdir(folder))
        for rep in range(self.args.repeat):
            self.run_mixdiag(mrow, [export], rep)
            if nb:
                self.run_mixdiag(nb, [export], rep, extra=("--no-breakdown",))
            if not peer.ready:
                continue
            runs = [cold, warm] if rep == 0 else [warm]
            for row, tag in zip(runs, ["cold", "warm"] if rep == 0 else ["warm"]):
                r = measure([str(peer.bin("nsys-ai")), "diagnose", copy.name, "--format", "json"],
                            folder / "_out" / f"diagnose.{tag}.{rep}.json", cwd=folder,
                            env=peers_env.peer_env(), timeout=self.args.timeout)
                row.runs.append(r)
                if r.rc != 0:
                    self.observe("nsys-ai", label, f"diagnose exit {r.rc}: {r.err_tail}")
        self.identical[label] = sha256([export]) == before
        if peer.ready:
            grew = copy.stat().st_size - size0
            idx = sqlite_indexes(copy) - idx0
            new = written_beside(folder, [copy], listing)
            if grew or idx:
                self.observe("nsys-ai", label, f"export modified: +{idx} indexes, {size0 / 1e6:.1f} -> "
                             f"{copy.stat().st_size / 1e6:.1f} MB")
            if new:
                self.observe("nsys-ai", label, f"wrote beside the export: {', '.join(new)}")

    def nsys_ai_bare(self, export: Path) -> None:
        """nsys-ai with DuckDB's extension folder empty, as after a plain ``pip install nsys-ai``, offline."""
        peer = self.peers["nsys-ai"]
        if not peer.ready:
            return
        folder = WORK / "nsys-ai-bare"
        (copy,) = copy_fresh([export], folder)
        size0, idx0 = copy.stat().st_size, sqlite_indexes(copy)
        home = folder / "_home"
        home.mkdir()
        r = measure([str(peer.bin("nsys-ai")), "diagnose", copy.name, "--format", "json"], folder / "_out" / "d.json",
                    cwd=folder, env={**peers_env.peer_env(), "HOME": str(home)}, timeout=self.args.timeout)
        err = r.out.with_suffix(".err").read_text(errors="replace")
        label = f"{export.name} (no DuckDB extension)"
        if "Failed to download extension" in err:
            self.observe("nsys-ai", label, "DuckDB tried to download sqlite_scanner from the network, failed; "
                         "nsys-ai fell back to sqlite3")
        grew, idx = copy.stat().st_size - size0, sqlite_indexes(copy) - idx0
        if grew or idx:
            self.observe("nsys-ai", label, f"wrote {idx} indexes into the export: {size0 / 1e6:.2f} -> "
                         f"{copy.stat().st_size / 1e6:.2f} MB (exit {r.rc})")

    def trace_input(self, label: str, files: list[Path]) -> None:
        """mixdiag and HTA's breakdowns on one Kineto trace (HTA wants a folder of rank files)."""
        before = sha256(files)
        mrow = self.mixdiag_row(label)
        peer = self.peers["HTA"]
        hrow = Row(label, "HTA", "temporal+kernel+idle+comm (+mem bw, stragglers)", ratio_to="analyze --json")
        if peer.ready:
            self.rows.append(hrow)
            folder = WORK / "hta" / label
            copies = copy_fresh(files, folder)
            sums = sha256(copies)
        for rep in range(self.args.repeat):
            self.run_mixdiag(mrow, files, rep)
            if not peer.ready:
                continue
            r = measure([str(peer.python), str(HTA_PROBE), str(folder)], WORK / "hta" / f"{label}.{rep}.json",
                        env=peers_env.peer_env(), timeout=self.args.timeout)
            hrow.runs.append(r)
            if r.rc != 0:
                self.observe("HTA", label, f"exit {r.rc}: {r.err_tail}")
            elif rep == 0:
                self.hta_findings(label, json.loads(r.out.read_text().strip().splitlines()[-1]))
        self.identical[label] = sha256(files) == before
        if peer.ready and sha256(copies) != sums:
            self.observe("HTA", label, "modified its input copy")

    def hta_pandas3(self, files: list[Path]) -> None:
        """HTA as pip installs it without the pin (pandas 3), on a small trace: observed, not timed."""
        peer = self.peers["HTA+pandas3"]
        if not peer.ready:
            return
        label = f"{files[0].parent.name} (pandas {peer.version('pandas')})"
        folder = WORK / "hta-pandas3"
        copy_fresh(files, folder)
        r = measure([str(peer.python), str(HTA_PROBE), str(folder), "--breakdowns", "temporal"],
                    WORK / "hta-pandas3.json", env=peers_env.peer_env(), timeout=self.args.timeout)
        if r.rc != 0:
            self.observe("HTA+pandas3", label, f"exit {r.rc}: {r.err_tail}")
            return
        res = json.loads(r.out.read_text().strip().splitlines()[-1])
        self.observe("HTA+pandas3", label, "loaded and ran the temporal breakdown" if res.get("load") == "ok"
                     else f"TraceAnalysis failed: {res.get('load')}")

    def hta_findings(self, label: str, res: dict) -> None:
        if res.get("load") != "ok":
            self.observe("HTA", label, f"TraceAnalysis failed: {res.get('load')}")
            return
        if len(res["ranks_by_hta_scan"]) < res["files"]:
            self.observe("HTA", label, f"its trace-folder scan found ranks {res['ranks_by_hta_scan']} in "
                         f"{res['files']} rank files (regex wants a space after '\"rank\":'); files passed by rank")
        for name, b in res["breakdowns"].items():
            if not b["ok"]:
                self.observe("HTA", label, f"{name}: {b['error']}")


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def table(bench: Bench) -> tuple[str, list[dict]]:
    rows, out = [], []
    for r in bench.rows:
        b = r.best()
        ref = next((m for m in bench.rows if m.input == r.input and m.tool == "mixdiag" and m.job == r.ratio_to), None)
        mb_ = ref.best() if ref else None
        d = {"input": r.input, "tool": r.tool, "job": r.job, "runs ok": f"{len(r.ok())}/{len(r.runs)}",
             "wall s": f"{b['wall_s']:.2f}" if b else "failed", "CPU s": f"{b['cpu_s']:.2f}" if b else "-",
             "peak RSS MB": f"{b['rss_bytes'] / 1e6:.0f}" if b else "-"}
        if r.ratio_to and b:
            d.update({"mixdiag/peer wall": ratio(mb_ and mb_["wall_s"], b["wall_s"]),
                      "CPU": ratio(mb_ and mb_["cpu_s"], b["cpu_s"]),
                      "RSS": ratio(mb_ and mb_["rss_bytes"], b["rss_bytes"])})
            if mb_ and "cold" not in r.job:
                q = mb_["cpu_s"] / b["cpu_s"]
                d["target CPU <= 0.5x"] = ("met" if q <= TARGET_CPU else "NOT met") + (
                    "" if any("breakdown" in doc for doc in bench.docs) else "*")
        if r.tool == "mixdiag":
            d["input unchanged"] = {True: "yes", False: "NO"}.get(bench.identical.get(r.input), "?")
        rows.append(d)
        out.append({**d, "best": b, "runs": [{k: getattr(x, k) for k in ("rc", "wall_s", "cpu_s", "rss_bytes")}
                                              for x in r.runs]})
    cols = ["input", "tool", "job", "runs ok", "wall s", "CPU s", "peak RSS MB", "mixdiag/peer wall", "CPU", "RSS",
            "target CPU <= 0.5x", "input unchanged"]
    return peers_caps.format_table(rows, cols), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool and input; best is reported (default 3)")
    ap.add_argument("--kernels", type=int, default=2_550_000, help="kernel rows of the simulated export")
    ap.add_argument("--kineto-steps", type=int, default=1500, help="steps of the 2-rank Kineto trace (~49 KB each)")
    ap.add_argument("--cpu-steps", type=int, default=40, help="engine steps in the CPU-only trace")
    ap.add_argument("--inputs", default="big,fixtures,kineto,cpu", help="which inputs (comma list)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per tool run")
    ap.add_argument("--no-install", action="store_true", help="use existing peer venvs only")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    say = (lambda m: None) if args.quiet else (lambda m: print(f"# {m}", file=sys.stderr, flush=True))
    which = set(args.inputs.split(","))
    bench = Bench(args, say)
    for p in bench.peers.values():
        say(p.note)
        if not p.ready:
            print(p.note)
    versions = {n: p.version("nsys-ai" if n == "nsys-ai" else "HolisticTraceAnalysis") for n, p in bench.peers.items()
                if p.ready}
    if "big" in which:
        export = big_export(args.kernels, say)
        say(f"{export.name}: mixdiag and nsys-ai, {args.repeat} repeats")
        bench.nsys_input(export.stem, export)
    if "fixtures" in which:
        for f in sorted(FIXTURES.glob("*.sqlite")):
            say(f"fixture {f.name}")
            bench.nsys_input(f.stem, f)
        bench.nsys_ai_bare(FIXTURES / "h100_2gpu_1s.sqlite")
    if "kineto" in which:
        files = kineto_trace(args.kineto_steps, say)
        say(f"kineto_ep2_{args.kineto_steps}: mixdiag and HTA")
        bench.trace_input(f"kineto_ep2_{args.kineto_steps}", files)
        bench.hta_pandas3(kineto_trace(300, say))
    if "cpu" in which:
        files = cpu_trace(args.cpu_steps, say)
        bench.trace_input(f"cpu_only_{args.cpu_steps}", files)
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # before parsing the documents
    bench.load_docs()
    text, rows = table(bench)
    caps = peers_caps.capability_rows(bench.docs, bench.diff_available)
    load = os.getloadavg()
    print(f"mixdiag vs peers: best of {args.repeat}; nsys-ai {versions.get('nsys-ai', '-')}, "
          f"HTA {versions.get('HTA', '-')}; load average {load[0]:.1f} on {os.cpu_count()} CPUs (trust CPU s); "
          f"this script's peak RSS while measuring {rss_self:.0f} MB "
          f"(a child's peak RSS reads at least its parent's at fork)\n")
    print(text)
    if not any("breakdown" in d for d in bench.docs):
        print("* analyze without the breakdown: no `breakdown` key in this build's analyze --json")
    nb = next((r for r in bench.rows if r.job.endswith("--no-breakdown") and r.best()), None)
    full = next((r for r in bench.rows if nb and r.input == nb.input and r.job == "analyze --json" and r.best()), None)
    print(f"breakdown's own cost on {nb.input}: analyze CPU {full.best()['cpu_s'] / nb.best()['cpu_s']:.2f}x "
          f"without it (target <= 1.30x)" if nb and full else
          "breakdown's own cost (target <= 1.30x of analyze without it): not measurable in this build "
          "(no analyze --no-breakdown)")
    print(f"\nwhich peer summaries mixdiag also gives (from its analyze --json keys over {len(bench.docs)} inputs; "
          f"breakdown section: {'present' if any('breakdown' in d for d in bench.docs) else peers_caps.NOT_IN_BUILD}; "
          f"mixdiag diff: {'present' if bench.diff_available else peers_caps.NOT_IN_BUILD})\n")
    print(peers_caps.format_table(caps, ["summary", "nsys-ai", "HTA", "mixdiag", "evidence"]))
    print("\nobserved failures and side effects\n")
    print(peers_caps.format_table(bench.observed, ["tool", "input", "observed"]) if bench.observed else "(none)")
    if args.json:
        print(json.dumps({"rows": rows, "capabilities": caps, "observed": bench.observed, "versions": versions,
                          "load_avg": load, "repeat": args.repeat}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
