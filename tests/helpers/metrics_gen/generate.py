"""Generate one capture: timed /metrics scrapes, the operator log, the operator log with per-step
lines, and truth, from a simulated engine with a fault schedule drawn from the seed."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from . import sglang_text, vllm_text
from .engine import draw_params, simulate
from .schedule import ScheduleConfig, draw_schedule
from .truth import steps_frame, units

DIALECTS = ("vllm", "sglang")
#: captures start in the past of this project's clock (vLLM stamps carry no year; a reader assumes
#: the latest year that puts the log in the past)
T0_UNIX = 1_794_000_000.0


@dataclass(frozen=True)
class GenConfig:
    """One capture to generate."""

    dialect: str = "vllm"
    seed: int = 0
    n_steps: int = 2000
    scrape_interval_s: float = 1.0
    stats_interval_s: float = 10.0      # VLLM_LOG_STATS_INTERVAL default
    decode_log_interval: int = 40       # SGLang --decode-log-interval default

    def __post_init__(self):
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}")
        if self.n_steps < 100 or self.scrape_interval_s <= 0 or self.stats_interval_s <= 0 or self.decode_log_interval < 1:
            raise ValueError("bad GenConfig")


@dataclass(frozen=True)
class Capture:
    root: Path
    scrapes: Path
    log: Path           # operator log (vLLM: stats lines; SGLang: Decode every decode_log_interval)
    details_log: Path   # vLLM: + Iteration lines; SGLang: a Decode line every forward
    steps: pd.DataFrame
    schedule: tuple


def _key(cfg: GenConfig) -> int:
    return cfg.seed * 8 + DIALECTS.index(cfg.dialect)


def generate(cfg: GenConfig, out: Path) -> Capture:
    out = Path(out)
    rng = np.random.default_rng([_key(cfg), 0x9E4])
    params = draw_params(rng)
    # per-deployment logging choices, drawn before anything whose count depends on n_steps
    form = int(rng.integers(0, 2))        # which Iteration line shape this "build" prints
    eplb = bool(rng.random() < 0.5)       # --eplb-config log_balancedness on half the captures
    cg_table = bool(rng.random() < 0.5)   # --cudagraph-metrics on half the captures
    sched = draw_schedule(_key(cfg), ScheduleConfig(n_steps=cfg.n_steps))
    t0 = T0_UNIX + 3600.0 * cfg.seed + float(rng.uniform(0, 60))
    steps = simulate(params, sched, cfg.n_steps, _key(cfg), t0)
    (out / "scrapes").mkdir(parents=True, exist_ok=True)
    (out / "truth").mkdir(exist_ok=True)
    pd_windows = [(e.start, e.end) for e in sched if e.cause == "pd_transfer"]
    scrape_times = np.arange(t0 - 0.5, steps[-1].t_end + cfg.scrape_interval_s, cfg.scrape_interval_s)
    # the scraper's own jitter; rounded to the file name's millisecond so name and content agree
    scrape_times = np.round(scrape_times + rng.uniform(0.0, 0.01, len(scrape_times)), 3)
    # SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 on half the SGLang captures; a stream of its own, so the
    # captures drawn before it existed stay the same
    timer = cfg.dialect == "sglang" and bool(np.random.default_rng([_key(cfg), 0x71E]).random() < 0.5)
    # which EPLB line shape the "build" prints (vLLM 0.32 added the step and model): a stream of its own
    eplb_form = int(np.random.default_rng([_key(cfg), 0xE91B]).integers(0, 2))
    if cfg.dialect == "vllm":
        op, det, ltruth = _vllm(cfg, params, steps, scrape_times, pd_windows, out, t0, form, eplb, cg_table,
                                eplb_form)
    else:
        op, det, ltruth = _sglang(cfg, params, steps, scrape_times, out, timer)
    # the server's clock zone: vLLM and SGLang print local time without a zone. Half the captures run
    # in UTC (containers), the rest in a zone of a big serving region; a stream of its own
    zone_rng = np.random.default_rng([_key(cfg), 0x20E])
    zone_s = 0 if zone_rng.random() < 0.5 else int(zone_rng.choice(LOG_ZONES_S))
    if zone_s:
        for log in (op, det):
            _to_zone(Path(log), cfg.dialect, zone_s, datetime.fromtimestamp(t0, tz=timezone.utc).year)
    sf = steps_frame(steps)
    sf.to_csv(out / "truth" / "steps.csv", index=False)
    units(sf, scrape_times).to_csv(out / "truth" / "intervals.csv", index=False)
    pd.DataFrame(ltruth).to_csv(out / "truth" / "log_lines.csv", index=False)
    pd.DataFrame([asdict(e) for e in sched], columns=["cause", "start", "end", "magnitude"]).to_csv(
        out / "truth" / "schedule.csv", index=False)
    (out / "truth" / "params.json").write_text(json.dumps({**asdict(params), **asdict(cfg), "t0_unix": t0, "device_timer": timer,
                                                               "eplb_form": eplb_form,
                                                               "log_utc_offset_s": zone_s}, indent=1))
    return Capture(out, out / "scrapes", op, det, sf, sched)


#: UTC+8 (China), UTC+9 (Japan/Korea), UTC+5:30 (India), UTC+1 (central Europe), UTC-5/-8 (US east/west)
LOG_ZONES_S = (8 * 3600, 9 * 3600, 5 * 3600 + 1800, 3600, -5 * 3600, -8 * 3600)
_VLLM_STAMP = re.compile(r"^(.*?\b(?:INFO|WARNING|DEBUG|ERROR) )(\d\d)-(\d\d) (\d\d:\d\d:\d\d)")
_SGLANG_STAMP = re.compile(r"^\[(\d{4})-(\d\d)-(\d\d) (\d\d:\d\d:\d\d)")


def _to_zone(path: Path, dialect: str, zone_s: int, year: int) -> None:
    """Rewrite a log's stamps as a server whose clock runs ``zone_s`` ahead of UTC prints them
    (``year``: the capture's, for vLLM's year-less stamps)."""
    def vllm(m):
        t = datetime(year, int(m.group(2)), int(m.group(3)), *map(int, m.group(4).split(":")))
        return f"{m.group(1)}{t + timedelta(seconds=zone_s):%m-%d %H:%M:%S}"

    def sglang(m):
        t = datetime(int(m.group(1)), int(m.group(2)), int(m.group(3)), *map(int, m.group(4).split(":")))
        return f"[{t + timedelta(seconds=zone_s):%Y-%m-%d %H:%M:%S}"

    rx, fn = (_VLLM_STAMP, vllm) if dialect == "vllm" else (_SGLANG_STAMP, sglang)
    lines = path.read_text().split("\n")
    path.write_text("\n".join(rx.sub(fn, ln, count=1) for ln in lines))


def _write_scrape(out: Path, t: float, text: str) -> None:
    (out / "scrapes" / f"{t:.3f}.prom").write_text(text)


def _line_truth(lines, kind, t, st, w0, w1):
    # "entry": the record's index in its log (a multi-line record, the CUDA-graph table, counts once)
    return {"entry": len(lines), "kind": kind, "t_s": t, "step": -1 if st is None else st.idx, "t0_s": w0,
            "t1_s": w1, "causes": "" if st is None else ";".join(sorted(st.causes))}


def _vllm(cfg, params, steps, scrape_times, pd_windows, out, t0, form, eplb, cg_table, eplb_form=0):
    reg = vllm_text.registry(with_nixl=True)
    created = t0 - 30.0
    op = vllm_text.startup_lines(t0 - 20.0, params)
    det = list(op)
    lt_op, lt_det = [], []
    si = 0
    next_stats = t0 + cfg.stats_interval_s
    acc = {"prompt": 0, "gen": 0, "pre": 0, "xfer": [], "cg": {}}
    sizes = vllm_text.capture_sizes(params.max_capture)
    last_st = None

    def flush_stats(t_log):
        line = vllm_text.stats_line(t_log, acc["prompt"] / cfg.stats_interval_s, acc["gen"] / cfg.stats_interval_s,
                                    last_st.running, last_st.waiting, acc["pre"], last_st.kv_usage)
        causes = ";".join(sorted({c for s in window if s for c in s.causes}))
        for lines, lt in ((op, lt_op), (det, lt_det)):
            lt.append({**_line_truth(lines, "stats", t_log, None, t_log - cfg.stats_interval_s, t_log), "causes": causes})
            lines.append(line)
            if acc["xfer"]:
                lt.append({**_line_truth(lines, "kv_transfer", t_log, None, t_log - cfg.stats_interval_s, t_log),
                           "causes": "pd_transfer"})
                lines.append(vllm_text.kv_transfer_line(t_log, acc["xfer"]))
            if cg_table and acc["cg"]:
                fb = "graph_fallback" if any("graph_fallback" in s.causes for s in window) else ""
                lt.append({**_line_truth(lines, "cudagraph", t_log, None, t_log - cfg.stats_interval_s, t_log),
                           "causes": fb})
                lines.append(vllm_text.cudagraph_table(t_log, sizes, acc["cg"]))

    window = []
    for st in steps:
        while si < len(scrape_times) and scrape_times[si] < st.t_end:
            _write_scrape(out, scrape_times[si], reg.render(created))
            si += 1
        while st.t_end >= next_stats and last_st is not None:
            flush_stats(next_stats)
            acc = {"prompt": 0, "gen": 0, "pre": 0, "xfer": [], "cg": {}}
            window = []
            next_stats += cfg.stats_interval_s
        pd_active = any(a <= st.idx < b for a, b in pd_windows)
        vllm_text.apply_step(reg, st, True, pd_active)
        acc["prompt"] += st.prompt_done
        acc["gen"] += len(st.itl) + len(st.ttft)
        acc["pre"] += st.preempted
        acc["xfer"] += st.kv_xfer
        row = vllm_text.graph_row(st, sizes)
        acc["cg"][row] = acc["cg"].get(row, 0) + 1
        window.append(st)
        last_st = st
        lt_det.append(_line_truth(det, "iteration", st.t_end, st, st.t_start, st.t_end))
        det.append(vllm_text.iteration_line(st.t_end, st, form))
        if eplb:
            for lines, lt in ((op, lt_op), (det, lt_det)):
                lt.append(_line_truth(lines, "eplb", st.t_end, st, st.t_start, st.t_end))
                lines.append(vllm_text.eplb_line(st.t_end, st, form=eplb_form))
    while si < len(scrape_times):
        _write_scrape(out, scrape_times[si], reg.render(created))
        si += 1
    (out / "vllm.log").write_text("\n".join(op) + "\n")
    (out / "details").mkdir(exist_ok=True)
    (out / "details" / "vllm.log").write_text("\n".join(det) + "\n")
    return out / "vllm.log", out / "details" / "vllm.log", [dict(x, log="operator") for x in lt_op] + [
        dict(x, log="details") for x in lt_det]


def _sglang(cfg, params, steps, scrape_times, out, device_timer=False):
    reg = sglang_text.registry(device_timer)
    created = steps[0].t_start - 30.0
    op = [sglang_text.server_args_line(created, params, cfg.decode_log_interval)]
    det = [sglang_text.server_args_line(created, params, 1)]
    lt_op, lt_det = [], []
    si, n_decode, fid = 0, 0, 0
    last_log_t, gen_since = steps[0].t_start, 0
    bal: list[float] = []
    ratio = 0.4
    for st in steps:
        while si < len(scrape_times) and scrape_times[si] < st.t_end:
            _write_scrape(out, scrape_times[si], reg.render(created))
            si += 1
        sglang_text.apply_step(reg, st)
        gen_since += st.gen_reqs
        fid += 1
        bal = (bal + [st.ep_balancedness])[-10:]
        if st.preempted:
            ratio = min(1.0, ratio + 0.05)
            for lines, lt in ((op, lt_op), (det, lt_det)):
                lt.append(_line_truth(lines, "retract", st.t_end, st, st.t_start, st.t_end))
                lines.append(sglang_text.retract_line(st, ratio - 0.05))
        if st.ctx_tokens:
            in_tps = st.ctx_tokens / max(st.t_end - st.t_start, 1e-6)
            for lines, lt in ((op, lt_op), (det, lt_det)):
                lt.append(_line_truth(lines, "prefill", st.t_end, st, st.t_start, st.t_end))
                lines.append(sglang_text.prefill_line(st, in_tps))
            sglang_text.set_gauges(reg, st, gen_since / max(st.t_end - last_log_t, 1e-6))
        else:
            n_decode += 1
            gen_tps = gen_since / max(st.t_end - last_log_t, 1e-6)
            det_line = sglang_text.decode_line(st, gen_tps, len(st.kv_xfer))
            lt_det.append(_line_truth(det, "decode", st.t_end, st, st.t_start, st.t_end))
            det.append(det_line)
            if n_decode % cfg.decode_log_interval == 0:
                lt_op.append(_line_truth(op, "decode", st.t_end, st, st.t_start, st.t_end))
                op.append(det_line)
                sglang_text.set_gauges(reg, st, gen_tps)
                last_log_t, gen_since = st.t_end, 0
        lt_det.append(_line_truth(det, "balancedness", st.t_end, st, st.t_start, st.t_end))
        det.append(sglang_text.balancedness_line(st, fid, sum(bal) / len(bal)))
    while si < len(scrape_times):
        _write_scrape(out, scrape_times[si], reg.render(created))
        si += 1
    (out / "sglang.log").write_text("\n".join(op) + "\n")
    (out / "details").mkdir(exist_ok=True)
    (out / "details" / "sglang.log").write_text("\n".join(det) + "\n")
    return out / "sglang.log", out / "details" / "sglang.log", [dict(x, log="operator") for x in lt_op] + [
        dict(x, log="details") for x in lt_det]
