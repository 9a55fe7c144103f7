"""Traffic through ``mixdiag load`` (run as a command, so the testbed drives vLLM exactly as a user
would) and the merge of several loads' records into one ``client.jsonl``.

Each stream (the base load, the long prompts, a saturation burst) is one ``mixdiag load`` process
writing its own file under ``DIR/loads/``; the merge keeps the base stream's header first (the
client-records reader recognises the file by it), prefixes every request id with its stream
name so ids stay unique, and keeps each stream's summary tagged with the stream.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mixdiag.vllm_testbed.process_guard import ProcessGuard


@dataclass(frozen=True)
class Stream:
    """One ``mixdiag load`` invocation."""

    name: str
    rate: float
    duration_s: float
    prompt_len: str
    output_len: str
    max_concurrency: int
    seed: int
    arrival: str = "poisson"

    def argv(self, url: str, model: str, out: Path) -> list[str]:
        return [sys.executable, "-m", "mixdiag", "load", url, "--rate", f"{self.rate:g}",
                "--duration", f"{self.duration_s:g}", "--prompt-len", self.prompt_len,
                "--output-len", self.output_len, "--max-concurrency", str(self.max_concurrency),
                "--arrival", self.arrival, "--seed", str(self.seed), "--model", model,
                "--timeout", "600", "-q", "--out", str(out)]


class RunningStream:
    """A started stream: its process and its records file."""

    def __init__(self, stream: Stream, proc: subprocess.Popen, out: Path, log: Path):
        self.stream, self.proc, self.out, self.log = stream, proc, out, log

    def done(self) -> bool:
        return self.proc.poll() is not None


def start(guard: ProcessGuard, stream: Stream, url: str, model: str, loads_dir: Path) -> RunningStream:
    """Start ``stream`` against ``url``; records go to ``loads_dir/<name>.jsonl``."""
    loads_dir.mkdir(parents=True, exist_ok=True)
    out = loads_dir / f"{stream.name}.jsonl"
    log = loads_dir / f"{stream.name}.out"
    with open(log, "wb") as f:
        proc = guard.popen(stream.argv(url, model, out), stdout=f, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL)
    return RunningStream(stream, proc, out, log)


def read_records(path: Path) -> list[dict]:
    """The JSON records of one load file (a missing file: none; a torn last line is dropped)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
    except FileNotFoundError:
        pass
    return out


def merge(files: dict[str, Path], out: Path) -> dict[str, int]:
    """Write every stream's records into ``out`` (the first stream's header first); returns
    the request count per stream."""
    counts: dict[str, int] = {}
    header_written = False
    with open(out, "w", encoding="utf-8") as f:
        for name, path in files.items():
            recs = read_records(path)
            counts[name] = 0
            for rec in recs:
                kind = rec.get("type")
                if kind == "header":
                    if header_written:
                        continue
                    rec = dict(rec, streams=list(files))
                    header_written = True
                elif kind == "request":
                    rec = dict(rec, request_id=f"{name}:{rec.get('request_id')}", stream=name)
                    counts[name] += 1
                elif kind == "summary":
                    rec = dict(rec, stream=name)
                if header_written:
                    f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return counts
