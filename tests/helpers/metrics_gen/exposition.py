"""Prometheus text exposition (format 0.0.4) of cumulative counters, gauges, histograms and
summaries, written by hand so the generator shares nothing with mixdiag's exporter or engine.

Basis: the exposition format (prometheus.io/docs/instrumenting/exposition_formats): ``# HELP`` /
``# TYPE`` per family, counters with a ``_total`` sample, histograms as cumulative ``_bucket{le}``
with ``+Inf`` = ``_count`` plus ``_sum``; ``prometheus_client`` also writes ``_created`` samples
(gauges for counters/histograms), as the real vLLM scrape in tests/fixtures/vllm032 shows.
"""
from __future__ import annotations

import bisect


def _labels(d: dict) -> str:
    if not d:
        return ""
    esc = (str(v).replace("\\", "\\\\").replace('"', '\\"') for v in d.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(d.keys(), esc)) + "}"


def _num(v: float) -> str:
    return repr(float(v))


class Family:
    """One metric family with per-label-set state."""

    def __init__(self, name: str, kind: str, help_: str, buckets: tuple[float, ...] = ()):
        if kind not in ("counter", "gauge", "histogram", "summary"):
            raise ValueError(kind)
        self.name, self.kind, self.help, self.buckets = name, kind, help_, tuple(buckets)
        self.state: dict[tuple, list] = {}

    def _get(self, labels: dict) -> list:
        key = tuple(labels.items())
        if key not in self.state:
            self.state[key] = [0.0, 0.0, [0] * len(self.buckets)] if self.kind in ("histogram", "summary") else [0.0]
        return self.state[key]

    def touch(self, **labels):
        """Create a labelled child at zero (vLLM/SGLang create theirs at start-up)."""
        self._get(labels)

    def inc(self, v: float = 1.0, **labels):
        self._get(labels)[0] += v

    def set(self, v: float, **labels):
        self._get(labels)[0] = v

    def observe(self, v: float, **labels):
        s = self._get(labels)
        s[0] += 1
        s[1] += v
        if self.buckets:
            i = bisect.bisect_left(self.buckets, v)   # le is inclusive
            if i < len(self.buckets):
                s[2][i] += 1

    def render(self, created: float) -> list[str]:
        base = self.name[:-6] if self.kind == "counter" and self.name.endswith("_total") else self.name
        # prometheus_client's 0.0.4 text keeps ``_total`` in a counter's HELP/TYPE (the real vLLM scrape)
        shown = base + "_total" if self.kind == "counter" else base
        out = [f"# HELP {shown} {self.help}", f"# TYPE {shown} {self.kind}"]
        created_lines = []
        for key, s in self.state.items():
            lab = dict(key)
            if self.kind == "counter":
                out.append(f"{base}_total{_labels(lab)} {_num(s[0])}")
                created_lines.append(f"{base}_created{_labels(lab)} {_num(created)}")
            elif self.kind == "gauge":
                out.append(f"{base}{_labels(lab)} {_num(s[0])}")
            else:
                if self.kind == "histogram":
                    cum = 0
                    for le, c in zip(self.buckets, s[2]):
                        cum += c
                        out.append(f"{base}_bucket{_labels({**lab, 'le': _num(le)})} {_num(cum)}")
                    out.append(f"{base}_bucket{_labels({**lab, 'le': '+Inf'})} {_num(s[0])}")
                out.append(f"{base}_count{_labels(lab)} {_num(s[0])}")
                out.append(f"{base}_sum{_labels(lab)} {_num(s[1])}")
                created_lines.append(f"{base}_created{_labels(lab)} {_num(created)}")
        if created_lines:   # prometheus_client writes _created as its own gauge family
            out += [f"# HELP {base}_created {self.help}", f"# TYPE {base}_created gauge"] + created_lines
        return out


class Registry:
    def __init__(self):
        self.families: dict[str, Family] = {}

    def add(self, name: str, kind: str, help_: str, buckets: tuple[float, ...] = ()) -> Family:
        f = Family(name, kind, help_, buckets)
        self.families[name] = f
        return f

    def __getitem__(self, name: str) -> Family:
        return self.families[name]

    def render(self, created: float) -> str:
        lines: list[str] = []
        for f in self.families.values():
            lines += f.render(created)
        return "\n".join(lines) + "\n"
