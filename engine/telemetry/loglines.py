"""Per-step log lines in the formats real servers print, so one parser reads them and us.

Opt-in (``mixdiag run --log-format vllm|sglang|both``), written to ``DIR/engine.log``.

vLLM (iteration details, vLLM PR #31193, ``core.py``), one line per non-idle step::

    (EngineCore_DP0 pid=4242) INFO 12-22 21:44:40 [core.py:349] Iteration(515): 0 context requests, 0 context tokens, 20 generation requests, 20 generation tokens, iteration elapsed time: 10.99 ms

Context = prefill chunks (vLLM counts every request without output yet as context), generation =
decode rows; the elapsed time is the step's wall time. Timestamps are UTC (what servers in
containers print, and what mixdiag's log readers assume), without a year as vLLM prints them.
``[core.py:349]`` is kept verbatim so the site matches the real line; the process tag carries the
instance's rank (``EngineCore_DP<rank>``) and our pid.

SGLang (2026 format, ``scheduler_metrics_mixin.py``): a ``Prefill batch`` line for every step
with prefill work (mixed steps included: SGLang logs before ``mix_with_running``, and its
``#running-req`` then counts the decodes folded in; on a prefill-only step it counts the decodes
that sit out), and a ``Decode batch`` line every ``decode_log_interval`` decode steps (SGLang's
``--decode-log-interval``, default 40)::

    [2026-04-05 20:02:51] Prefill batch, #new-seq: 1, #new-token: 158, #cached-token: 0, token usage: 0.08, #running-req: 31, #queue-req: 0, cuda graph: False, input throughput (token/s): 559.53
    [2026-04-05 20:02:51] Decode batch, #running-req: 32, #token: 11179, token usage: 0.08, cuda graph: True, gen throughput (token/s): 1635.11, #queue-req: 0

``cuda graph`` is True only for a step whose planned graph mode is FULL. Throughputs are tokens
since the previous line of the same kind over the time since it, as SGLang computes them.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from mixdiag.errors import UserError

FORMATS = ("vllm", "sglang")


def parse_formats(value: str) -> tuple[str, ...]:
    """``vllm`` | ``sglang`` | ``both`` -> the formats to write."""
    v = (value or "").strip().lower()
    if v == "both":
        return FORMATS
    if v in FORMATS:
        return (v,)
    raise UserError(f"--log-format must be vllm, sglang or both, got {value!r}")


@dataclass(frozen=True)
class LogLineConfig:
    """What :class:`LogLineWriter` prints. ``rank`` tags the instance (``engine<rank>``)."""

    formats: tuple[str, ...] = FORMATS
    decode_log_interval: int = 40
    rank: int = 0
    show_rank: bool = False  # SGLang prefix " DP<rank> TP<rank>" (multi-instance runs)

    def __post_init__(self):
        bad = [f for f in self.formats if f not in FORMATS]
        if bad or not self.formats:
            raise UserError(f"log formats must be among {', '.join(FORMATS)}, got {list(self.formats)}")
        if self.decode_log_interval < 1:
            raise UserError(f"decode_log_interval must be >= 1, got {self.decode_log_interval}")
        if self.rank < 0:
            raise UserError(f"rank must be >= 0, got {self.rank}")


def _int(record: Any, name: str) -> int | None:
    v = getattr(record, name, None)
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else int(round(v))


def _float(record: Any, name: str) -> float | None:
    v = getattr(record, name, None)
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


class LogLineWriter:
    """Observer writing vLLM and/or SGLang lines for each step record to ``sink`` (path or stream).

    Fields the record lacks are printed from what it has where the format's meaning allows
    (``#token`` from ``kv_tokens``, else ``kv_usage`` x ``kv_capacity_tokens``) and otherwise as 0
    with a count in :attr:`unknown_fields`, so a reader can tell that a 0 was not measured.
    """

    def __init__(self, sink: str | Path | TextIO, config: LogLineConfig = LogLineConfig(),
                 kv_capacity_tokens: int | None = None, pid: int | None = None):
        self.config = config
        self.kv_capacity_tokens = kv_capacity_tokens
        self.pid = os.getpid() if pid is None else pid
        if isinstance(sink, (str, Path)):
            try:
                self._stream: TextIO = open(sink, "x", encoding="utf-8")
            except FileExistsError:
                raise UserError(f"{sink} already exists; choose another run directory") from None
            self._owned = True
        else:
            self._stream, self._owned = sink, False
        self._decode_ct = 0
        self._last_prefill_t: float | None = None
        self._last_decode_t: float | None = None
        self._gen_since_decode_log = 0
        self._prev_running = 0
        self.lines_written = 0
        self.unknown_fields: dict[str, int] = {}

    def __call__(self, record: Any) -> None:
        self.observe_step(record)

    def observe_step(self, record: Any) -> None:
        """Write the lines one step record calls for."""
        kind = getattr(record, "kind", None)
        t0, t1 = _float(record, "t_start_s"), _float(record, "t_end_s")
        if t1 is None:
            t1 = time.time()
        if t0 is None:
            t0 = t1
        out = _int(record, "output_tokens") or 0
        self._gen_since_decode_log += out
        if kind in ("prefill", "decode", "mixed"):
            if "vllm" in self.config.formats:
                self._write(self.vllm_line(record, t0, t1))
            if "sglang" in self.config.formats:
                if kind in ("prefill", "mixed"):
                    self._write(self.sglang_prefill_line(record, t0, t1))
                else:
                    self._decode_ct += 1
                    if self._decode_ct % self.config.decode_log_interval == 0:
                        self._write(self.sglang_decode_line(record, t0, t1))
        running = _int(record, "running_reqs")
        if running is not None:
            self._prev_running = running

    def write_server_args(self, scheduler: Any, t: float | None = None) -> None:
        """SGLang's startup ``server_args=ServerArgs(...)`` line (only when writing SGLang lines).

        It is the only place an SGLang log states ``enable_mixed_chunk``, ``chunked_prefill_size``,
        ``cuda_graph_max_bs`` and ``decode_log_interval``; readers need them to tell folded-in
        decodes from stalled ones. Mapped from our scheduler: ``mix_running`` uses its own knobs;
        ``token_budget`` mixes every step (chunk = ``max_num_batched_tokens``); ``prefill_first``
        never mixes.
        """
        if "sglang" not in self.config.formats:
            return
        policy = getattr(scheduler, "policy", None)
        if policy == "mix_running":
            mixed, chunk = bool(scheduler.enable_mixed_chunk), int(scheduler.chunked_prefill_size)
        else:
            mixed, chunk = policy == "token_budget", int(scheduler.max_num_batched_tokens)
        sizes = tuple(getattr(scheduler, "cudagraph_capture_sizes", ()) or ())
        eager = getattr(scheduler, "enforce_eager", False) or getattr(scheduler, "cudagraph_mode", "") == "NONE"
        max_bs = "None" if eager or not sizes else str(max(sizes))
        stamp = time.time() if t is None else t
        self._write(f"{self._sglang_prefix(stamp)}server_args=ServerArgs(model_path='mixdiag-engine', "
                    f"chunked_prefill_size={chunk}, enable_mixed_chunk={mixed}, cuda_graph_max_bs={max_bs}, "
                    f"disable_cuda_graph={eager}, decode_log_interval={self.config.decode_log_interval}, "
                    f"schedule_policy='{policy}')")

    # ---- formats ------------------------------------------------------------------------------
    def vllm_line(self, record: Any, t0: float, t1: float) -> str:
        stamp = time.strftime("%m-%d %H:%M:%S", time.gmtime(t1))
        step = _int(record, "step") or 0
        return (f"(EngineCore_DP{self.config.rank} pid={self.pid}) INFO {stamp} [core.py:349] "
                f"Iteration({step}): {self._get(record, 'prefill_reqs')} context requests, "
                f"{self._get(record, 'prefill_tokens')} context tokens, "
                f"{self._get(record, 'decode_reqs')} generation requests, "
                f"{self._get(record, 'decode_rows')} generation tokens, "
                f"iteration elapsed time: {(t1 - t0) * 1e3:.2f} ms")

    def sglang_prefill_line(self, record: Any, t0: float, t1: float) -> str:
        new_tokens = self._get(record, "prefill_tokens")
        gap = t1 - (self._last_prefill_t if self._last_prefill_t is not None else t0)
        self._last_prefill_t = t1
        if getattr(record, "kind", None) == "mixed":
            running = self._get(record, "decode_reqs")
        else:  # the running batch that sat this step out (engine's count, else who ran before it)
            stalled = _int(record, "stalled_decode_reqs")
            running = stalled if stalled is not None else self._prev_running
        return (f"{self._sglang_prefix(t1)}Prefill batch, #new-seq: {self._get(record, 'prefill_reqs')}, "
                f"#new-token: {new_tokens}, #cached-token: {self._get(record, 'prefix_hit_tokens')}, "
                f"token usage: {self._usage(record):.2f}, #running-req: {running}, "
                f"#queue-req: {self._get(record, 'waiting_reqs')}, cuda graph: {self._graph(record)}, "
                f"input throughput (token/s): {new_tokens / gap if gap > 0 else 0.0:.2f}")

    def sglang_decode_line(self, record: Any, t0: float, t1: float) -> str:
        gap = t1 - (self._last_decode_t if self._last_decode_t is not None else t0)
        self._last_decode_t = t1
        gen = self._gen_since_decode_log
        self._gen_since_decode_log = 0
        return (f"{self._sglang_prefix(t1)}Decode batch, #running-req: {self._get(record, 'decode_reqs')}, "
                f"#token: {self._kv_tokens(record)}, token usage: {self._usage(record):.2f}, "
                f"cuda graph: {self._graph(record)}, gen throughput (token/s): {gen / gap if gap > 0 else 0.0:.2f}, "
                f"#queue-req: {self._get(record, 'waiting_reqs')}")

    # ---- helpers ------------------------------------------------------------------------------
    def _sglang_prefix(self, t: float) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
        rank = f" DP{self.config.rank} TP{self.config.rank}" if self.config.show_rank else ""
        return f"[{stamp}{rank}] "

    def _get(self, record: Any, name: str) -> int:
        v = _int(record, name)
        if v is None:
            self.unknown_fields[name] = self.unknown_fields.get(name, 0) + 1
            return 0
        return v

    def _usage(self, record: Any) -> float:
        v = _float(record, "kv_usage")
        if v is None:
            self.unknown_fields["kv_usage"] = self.unknown_fields.get("kv_usage", 0) + 1
            return 0.0
        return v

    def _kv_tokens(self, record: Any) -> int:
        v = _int(record, "kv_tokens")
        if v is not None:
            return v
        usage = _float(record, "kv_usage")
        if usage is not None and self.kv_capacity_tokens:
            return int(round(usage * self.kv_capacity_tokens))
        self.unknown_fields["kv_tokens"] = self.unknown_fields.get("kv_tokens", 0) + 1
        return 0

    @staticmethod
    def _graph(record: Any) -> bool:
        return getattr(record, "graph_mode", None) == "FULL"

    def _write(self, line: str) -> None:
        self._stream.write(line + "\n")
        self.lines_written += 1

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        """Flush, and close the file when the writer opened it."""
        if self._owned and not self._stream.closed:
            self._stream.close()
        elif not self._owned:
            self._stream.flush()
