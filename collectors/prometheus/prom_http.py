"""HTTP fetching: the Prometheus HTTP API (``query_range`` over a window and a label selector), an
engine's ``/metrics`` text, and telling the two kinds of URL apart (:func:`url_kind`).

This is how mixdiag reads a fleet: Prometheus (or whatever federates it: Thanos, Mimir, VictoriaMetrics
speak the same API) is the distributed store. Fetching only: the readers that turn the answers
into Timelines are :mod:`.server_reader` (a Prometheus server), :mod:`.endpoint` and :mod:`.live`.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime

from mixdiag import wire
from mixdiag.errors import UserError

from mixdiag.collectors.prometheus.prom_common import ITERATION_TOKENS, ITL_HISTOGRAMS, TTFT_HISTOGRAMS
from mixdiag.collectors.prometheus.prom_text import looks_like_exposition

#: Metric-name prefixes fetched: vLLM, SGLang (both spellings), mixdiag's engine, DCGM exporter.
PREFIXES = ("vllm:", "vllm_", "sglang:", "sglang_", wire.METRIC_PREFIX + "_", "DCGM_FI_")
#: Prometheus refuses a range query with more than 11,000 points per series.
MAX_POINTS = 10_000
#: A scrape larger than this is refused (an engine's /metrics is a few hundred KiB at most).
MAX_SCRAPE_BYTES = 16 * 2**20
HTTP_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 5.0
_kinds: dict[str, str] = {}  # URL -> kind, probed once per process


def matchers(selector: str) -> str:
    """``{job="x", instance=~"a.*"}`` or ``job="x"`` -> the matcher list without braces."""
    sel = (selector or "").strip()
    if sel.startswith("{") and sel.endswith("}"):
        sel = sel[1:-1].strip()
    if "{" in sel or "}" in sel:
        raise UserError(f"selector {selector!r}: give label matchers only, e.g. '{{job=\"vllm\"}}'")
    return sel.rstrip(",")


def queries(selector: str = "") -> list[str]:
    """The PromQL selectors fetched: every non-bucket series, the ITL histogram buckets, ``up``."""
    extra = matchers(selector)
    extra = ", " + extra if extra else ""
    # Metric names hold only [a-zA-Z0-9_:], so they need no regex escaping.
    names = "|".join(p + ".*" for p in PREFIXES)
    # Histograms whose buckets the interval rows read: ITL, and the dialects' TTFT / iteration tokens.
    hists = tuple(ITL_HISTOGRAMS) + tuple(TTFT_HISTOGRAMS) + tuple(ITERATION_TOKENS)
    itl = "|".join(h + "_bucket" for h in hists)
    itl += "|" + "|".join(h.replace(":", "_", 1) + "_bucket" for h in hists if ":" in h)
    # `up` marks when a target was down: its counters restart from zero when it comes back, so
    # the first interval after a down point counts everything (not just what the next scrape adds).
    return [f'{{__name__=~"{names}", __name__!~".*_bucket"{extra}}}', f'{{__name__=~"{itl}"{extra}}}',
            f'{{__name__="up"{extra}}}']


def post(url: str, path: str, params: dict, timeout_s: float) -> bytes:
    """The body of an API answer (an HTTP error's too, when it is the API's JSON error document)."""
    body = urllib.parse.urlencode(params).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=body,
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        try:
            out = e.read()
            json.loads(out)
            return out
        except (ValueError, OSError):
            raise UserError(f"Prometheus at {url} answered HTTP {e.code} to {path}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise UserError(f"cannot reach Prometheus at {url}: {getattr(e, 'reason', e)}") from None


def api_data(url: str, path: str, raw: bytes) -> dict:
    """``data`` of an API answer; UserError for an error document or a body that is no JSON."""
    try:
        doc = json.loads(raw)
    except ValueError:
        raise UserError(f"Prometheus at {url}: {path} did not answer JSON") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc if not isinstance(doc, dict) else doc.get("error", doc)
        raise UserError(f"Prometheus at {url}: {doc.get('errorType', 'error') if isinstance(doc, dict) else 'error'}: "
                        f"{err}")
    return doc["data"]


def api_get(url: str, path: str, params: dict, timeout_s: float) -> dict:
    """``data`` of the API answer to ``path`` with ``params`` (see :func:`post`, :func:`api_data`)."""
    return api_data(url, path, post(url, path, params, timeout_s))


def fmt_s(seconds: float) -> str:
    """Seconds for the API without losing digits (``%g`` would round 12.3456789 to 12.3457)."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".")


def query_range(url: str, promql: str, start: float, end: float, step_s: float,
                timeout_s: float = 30.0) -> list[dict]:
    """``/api/v1/query_range`` as a list of ``{metric, values}``; long windows are fetched in chunks."""
    out: dict[tuple, dict] = {}
    span = step_s * MAX_POINTS
    t = start
    while t <= end:
        t_end = min(end, t + span)
        data = api_get(url, "/api/v1/query_range", {"query": promql, "start": f"{t:.3f}", "end": f"{t_end:.3f}",
                                                 "step": fmt_s(step_s)}, timeout_s)
        if data.get("resultType") != "matrix":
            raise UserError(f"Prometheus at {url}: expected a matrix, got {data.get('resultType')}")
        for series in data["result"]:
            key = tuple(sorted(series["metric"].items()))
            tgt = out.setdefault(key, {"metric": series["metric"], "values": []})
            seen = {v[0] for v in tgt["values"]}
            tgt["values"].extend(v for v in series.get("values", []) if v[0] not in seen)
        t = t_end + step_s
    return list(out.values())


_URL_PARAMS = ("selector", "start", "end", "step", "window", "aggregate")


def _seconds(name: str, text: str) -> float:
    """Unix seconds or RFC 3339 (``2026-11-30T05:00:00Z``) -> float seconds; durations in seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    if name in ("start", "end"):
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise UserError(f"URL parameter {name}={text!r}: expected seconds" + (" or RFC 3339" if name != "step" else ""))


def split_url(url: str) -> tuple[str, dict]:
    """``http://h:9090/?selector={job="x"}&window=600&step=5`` -> (server URL, parameters).

    Lets ``mixdiag ingest URL`` carry the window and selector in the one argument it takes.
    Parameters: ``selector``, ``start``/``end`` (unix seconds or RFC 3339), ``step``, ``window``
    (seconds). Unknown parameters are refused, so a typo is not silently ignored.
    """
    parts = urllib.parse.urlsplit(url)
    params = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(params) - set(_URL_PARAMS))
    if unknown:
        raise UserError(f"unknown URL parameter(s) {', '.join(unknown)}; use {', '.join(_URL_PARAMS)}")
    out: dict = {}
    for k, vals in params.items():
        out[k] = vals[-1] if k in ("selector", "aggregate") else _seconds(k, vals[-1])
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return base, out


def check_url(url: str, what: str = "URL") -> str:
    """``url`` if it is an http(s) URL with a host; UserError otherwise (no file://, no javascript:)."""
    u = urllib.parse.urlparse(str(url).strip())
    if u.scheme not in ("http", "https") or not u.netloc:
        raise UserError(f"{what} must be an http:// or https:// URL, got {url!r}")
    return str(url).strip().rstrip("/")


def fetch_text(url: str, timeout_s: float = HTTP_TIMEOUT_S, max_bytes: int = MAX_SCRAPE_BYTES) -> str:
    """GET ``url`` as text; UserError (one line) on a network error, an HTTP error or an oversize body."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4", "User-Agent": "mixdiag"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 (http/https checked by check_url)
            body = r.read(max_bytes + 1)
    except urllib.error.HTTPError as e:
        raise UserError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(f"{url}: cannot connect ({reason})") from None
    if len(body) > max_bytes:
        raise UserError(f"{url}: response larger than {max_bytes // 2**20} MiB")
    return body.decode("utf-8", errors="replace")


def _strip_query(url: str) -> str:
    p = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((p.scheme, p.netloc, p.path, "", ""))


def _is_prometheus(url: str, timeout_s: float) -> bool:
    """``GET <url>/api/v1/status/buildinfo`` answers ``{"status": "success", ...}``."""
    probe = _strip_query(url).rstrip("/") + "/api/v1/status/buildinfo"
    try:
        with urllib.request.urlopen(probe, timeout=timeout_s) as r:  # noqa: S310 (http/https only)
            doc = json.loads(r.read(1 << 20))
    except (urllib.error.URLError, OSError, ValueError, TimeoutError):
        return False
    return isinstance(doc, dict) and doc.get("status") == "success"


def url_kind(url: str, *, probe: bool = True, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """``"engine"`` (text exposition) or ``"prometheus"`` (HTTP API) for an http(s) URL.

    A URL whose path ends in ``/metrics`` is an engine. Otherwise, with ``probe`` (format
    detection), ``<url>/api/v1/status/buildinfo`` answering Prometheus JSON means a server, a URL
    answering text exposition an engine, and neither is a UserError; without ``probe`` (live mode,
    which must not block on the network when a URL is set) anything else is a server.
    """
    path_is_metrics = urllib.parse.urlsplit(url).path.rstrip("/").endswith("/metrics")
    if not probe:
        return "engine" if path_is_metrics else "prometheus"
    if url in _kinds:
        return _kinds[url]
    if path_is_metrics:
        kind = "engine"
    elif _is_prometheus(url, timeout_s):
        kind = "prometheus"
    else:
        try:
            text = fetch_text(url, timeout_s=timeout_s)
            why = "" if looks_like_exposition(text[:65536].encode("utf-8", "replace")) else "no text exposition"
        except UserError as e:
            why = str(e).split(": ", 1)[-1]
        if why:
            raise UserError(f"{url}: neither a Prometheus server (no /api/v1/status/buildinfo) "
                            f"nor a /metrics endpoint ({why})")
        kind = "engine"
    _kinds[url] = kind
    return kind
