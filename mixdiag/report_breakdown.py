"""Text and HTML renderings of the kernel and idle breakdown (:mod:`mixdiag.diagnosis.breakdown`)."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

from mixdiag.fmt import ms


def _pct(v) -> str:
    return "-" if v is None or not np.isfinite(v) else f"{v:.0%}"


def straggler_sentence(row) -> str:
    """'rank 1's fused_moe ran 4.1x longer while rank 0, rank 2 waited in all_to_all (step 12)'."""
    kr = row.kernel_ratio
    ran = (f"{row.label}'s {row.kernel} ran {kr:.1f}x longer" if row.kernel and np.isfinite(kr)
           else f"{row.label}'s {row.kernel} ran where the others had none" if row.kernel
           else f"{row.label} computed {row.ratio:.1f}x the median rank")
    where = f" in {row.comm_kernel}" if row.comm_kernel else " in communication"
    return (f"{ran} (compute {row.ratio:.1f}x the median rank) while {row.waiting} waited{where} "
            f"{ms(row.wait_s)} (step {row.step}; {row.step_classes})")


def _classes(b) -> list[str]:
    return list(dict.fromkeys(b.utilisation["step_class"]))


def breakdown_lines(b, top: int = 3) -> list[str]:
    """The ``analyze`` text section: utilisation and idle split, comm overlap, top kernels of the spike
    steps (else of the capture), copies by direction, stragglers."""
    if not b.has_device_activity:
        return ["", f"Device breakdown: {b.notes[0] if b.notes else 'no device activity'}"]
    out = ["", "Device breakdown by step class (busy / wall; idle split host | kernel | other wait):",
           f"{'instance':<24} {'rank':>4} {'class':<12} {'steps':>6} {'wall':>10} {'util':>5} {'host wait':>10} "
           f"{'kern wait':>10} {'other':>10} {'comm':>10} {'overlap':>7}", "-" * 120]
    comm = b.comm.set_index(["instance", "rank", "step_class"]) if len(b.comm) else None
    for r in b.utilisation.itertuples(index=False):
        c = comm.loc[(r.instance, r.rank, r.step_class)] if comm is not None and (
            r.instance, r.rank, r.step_class) in comm.index else None
        out.append(f"{r.instance[-24:]:<24} {r.rank:>4} {r.step_class[:12]:<12} {r.steps:>6} {ms(r.wall_s):>10} "
                   f"{_pct(r.utilisation):>5} {ms(r.host_wait_s):>10} {ms(r.kernel_wait_s):>10} "
                   f"{ms(r.other_idle_s):>10} {ms(c['comm_s']) if c is not None else '-':>10} "
                   f"{_pct(c['overlap_share']) if c is not None else '-':>7}")
    cls = "spike" if (b.kernels["step_class"] == "spike").any() else "all"
    out += ["", f"top kernels of the {'spike steps' if cls == 'spike' else 'capture'} by device time:"]
    for (inst, rank), g in b.kernels[b.kernels["step_class"] == cls].groupby(["instance", "rank"], sort=True):
        out.append(f"  {inst} rank {rank}: " + "; ".join(f"{k.kernel[:60]} {ms(k.time_s)} ({k.share:.0%}, {k.calls}x)"
                                                     for k in g.head(top).itertuples(index=False)))
    mem = b.memcpy[b.memcpy["step_class"] == "all"]
    if len(mem):
        agg = mem.groupby(["instance", "rank", "direction"], sort=True).agg(
            copies=("copies", "sum"), bytes=("bytes", "sum"), time_s=("time_s", "sum")).reset_index()
        out += ["", "copies (whole capture): " + "; ".join(
            f"{a.instance} rank {a.rank} {a.direction} {a.copies}x {a.bytes / 1e6:.3g} MB "
            f"{a.bytes / a.time_s / 1e9 if a.time_s > 0 else float('nan'):.3g} GB/s"
            for a in agg.itertuples(index=False))]
    st = b.stragglers
    if len(st):
        spikes = st[st["step_classes"].str.contains(r"\bspike\b")]
        pick = (spikes if len(spikes) else st).sort_values("ratio", ascending=False, kind="stable").head(top)
        out += ["", f"stragglers ({len(st)} steps; shown: the largest{' spike' if len(spikes) else ''} ones):"]
        out += [f"  {straggler_sentence(r)}" for r in pick.itertuples(index=False)]
    elif len(b.straggler_summary):
        out += ["", "stragglers: none (no rank's compute stood >= the threshold over the median while the others waited)"]
    out += [f"  note: {n}" for n in b.notes]
    return out


def _table(df: pd.DataFrame, cols: list[str], fmt: dict) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    rows = []
    for r in df[cols].itertuples(index=False):
        cells = [fmt.get(c, str)(v) for c, v in zip(cols, r)]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def breakdown_html(b, top: int = 5) -> str:
    """The HTML report's device-breakdown section (escaped; tables only, no script)."""
    if not b.has_device_activity:
        return f"<h2>Device breakdown</h2><p>{html.escape(b.notes[0] if b.notes else 'no device activity')}</p>"
    f = {"wall_s": ms, "busy_s": ms, "idle_s": ms, "host_wait_s": ms, "kernel_wait_s": ms, "other_idle_s": ms,
         "utilisation": _pct, "comm_s": ms, "compute_s": ms, "overlap_s": ms, "overlap_share": _pct, "opaque_s": ms,
         "time_s": ms, "share": _pct, "bandwidth_gb_per_s": lambda v: f"{v:.3g}", "ratio": lambda v: f"{v:.2f}x",
         "compute_s ": ms}
    parts = ["<h2>Device breakdown by step class</h2>",
             "<p>Busy / wall per device; idle split into host wait (no launch issued yet), kernel wait (a launch "
             "was issued, the GPU had not started it) and other (launch unknown).</p>",
             _table(b.utilisation, list(b.utilisation.columns), f)]
    if len(b.comm):
        parts += ["<h3>Communication and overlap with compute</h3>", _table(b.comm, list(b.comm.columns), f)]
    kern = b.kernels.groupby(["instance", "rank", "step_class"], sort=False).head(top)
    parts += [f"<h3>Top {top} kernels per class</h3>", _table(kern, list(kern.columns), f)]
    if len(b.memcpy):
        parts += ["<h3>Copies by direction and stream</h3>", _table(b.memcpy, list(b.memcpy.columns), f)]
    if len(b.stragglers):
        parts += ["<h3>Stragglers</h3><ul>"] + [f"<li>{html.escape(straggler_sentence(r))}</li>" for r in
                                                 b.stragglers.sort_values("ratio", ascending=False).head(20)
                                                 .itertuples(index=False)] + ["</ul>"]
    if b.notes:
        parts += ["<ul>"] + [f"<li>{html.escape(n)}</li>" for n in b.notes] + ["</ul>"]
    return "\n".join(parts)
