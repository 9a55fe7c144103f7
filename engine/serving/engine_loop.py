"""The engine in its own thread: commands in through a thread-safe queue, tokens out per request.

HTTP handlers never touch the :class:`Engine` (it is not thread-safe) and never wait on it: they
put ``add``/``abort`` commands on :attr:`EngineLoop.inbox` and read their own ``asyncio.Queue``,
which the loop thread fills with ``loop.call_soon_threadsafe(queue.put_nowait, item)``. The loop
steps while any request is unfinished and blocks on the inbox otherwise, so an idle server costs
nothing and a busy one is never paused by a slow client.

Items a request's queue receives, in order:
``("accepted", rid)`` or ``("error", status, message)`` once; then ``("tokens", ids, t_s, finish)``
per engine step that produced tokens for it (``finish`` is ``"stop"``/``"length"`` on the last);
or ``("error", 500, message)`` if the engine failed.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from mixdiag.engine.core.request import InvalidRequest, SamplingParams, Status

log = logging.getLogger("mixdiag.serve")


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    sent: int = 0

    def put(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:   # the handler's event loop is closed (server shutting down)
            pass


@dataclass
class LoopStats:
    steps: int = 0
    added: int = 0
    finished: int = 0
    aborted: int = 0
    failed_steps: int = 0
    last_error: str | None = None
    step_s_total: float = field(default=0.0)
    kv_free_blocks: int = 0      # the block pool as of the last loop turn (the loop thread writes it)
    kv_total_blocks: int = 0


class EngineLoop:
    """Run ``engine`` in a daemon thread; ``submit``/``abort`` are safe to call from any thread."""

    def __init__(self, engine, submit: Callable | None = None, *, idle_poll_s: float = 0.05,
                 on_abort: Callable[[object], None] | None = None):
        self.engine = engine
        self._submit = submit or engine.add_request
        # Called with the engine on the loop thread after requests were aborted between steps: the
        # step observers (the /metrics gauges) saw the state before the abort and see no step until
        # the next request comes, so they must be told the state now (a server left idle by aborts
        # would otherwise show running > 0 and KV in use while /health says nothing is in flight).
        self._on_abort = on_abort
        self.inbox: queue.Queue = queue.Queue()
        self._sinks: dict[str, _Sink] = {}
        self._stop = threading.Event()
        self._idle_poll_s = idle_poll_s
        self.stats = LoopStats()
        self.healthy = True
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    # ---- called from the HTTP side --------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the loop to end after its current step and wait for the thread."""
        self._stop.set()
        self.inbox.put(("wake",))
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, rid: str, prompt_ids, params: SamplingParams, aloop: asyncio.AbstractEventLoop,
               aqueue: asyncio.Queue) -> None:
        self.inbox.put(("add", rid, list(prompt_ids), params, _Sink(aloop, aqueue)))

    def abort(self, rid: str) -> None:
        self.inbox.put(("abort", rid))

    def call(self, fn: Callable[[object], object]) -> "queue.Queue":
        """Run ``fn(engine)`` on the loop thread between steps; the result arrives on the returned queue."""
        out: queue.Queue = queue.Queue(maxsize=1)
        self.inbox.put(("call", fn, out))
        return out

    @property
    def in_flight(self) -> int:
        return len(self._sinks)

    # ---- the loop thread ------------------------------------------------------------------
    def _run(self) -> None:
        eng = self.engine
        self.stats.kv_total_blocks = eng.config.cache.num_blocks
        while not self._stop.is_set():
            self.stats.kv_free_blocks = eng.kv_manager.num_free_blocks
            busy = eng.has_unfinished()
            try:
                cmd = self.inbox.get(timeout=self._idle_poll_s) if not busy else self.inbox.get_nowait()
            except queue.Empty:
                cmd = None
            aborted0 = self.stats.aborted
            while cmd is not None:
                self._handle(cmd)
                try:
                    cmd = self.inbox.get_nowait()
                except queue.Empty:
                    cmd = None
            if self.stats.aborted != aborted0:
                self._state_changed()
            if self._stop.is_set() or not eng.has_unfinished():
                continue
            try:
                rec = eng.step()
            except Exception as e:   # keep serving /health and /metrics; fail what was in flight
                log.exception("engine step failed")
                self.stats.failed_steps += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"
                self.healthy = False
                for rid, sink in list(self._sinks.items()):
                    sink.put(("error", 500, f"engine step failed: {self.stats.last_error}"))
                    self._forget(rid, abort=True)
                self._state_changed()
                continue
            self.stats.steps += 1
            self.stats.step_s_total += rec.t_end_s - rec.t_start_s
            self._deliver(rec)

    def _handle(self, cmd) -> None:
        op = cmd[0]
        if op == "add":
            _, rid, prompt, params, sink = cmd
            try:
                self._submit(prompt, params, request_id=rid)
            except InvalidRequest as e:
                sink.put(("error", 400, str(e)))
                return
            self._sinks[rid] = sink
            self.stats.added += 1
            sink.put(("accepted", rid))
        elif op == "abort":
            if cmd[1] in self._sinks:
                self.stats.aborted += 1
                self._forget(cmd[1], abort=True)
        elif op == "call":
            _, fn, out = cmd
            try:
                out.put((True, fn(self.engine)))
            except Exception as e:
                out.put((False, e))

    def _state_changed(self) -> None:
        self.stats.kv_free_blocks = self.engine.kv_manager.num_free_blocks
        if self._on_abort is None:
            return
        try:
            self._on_abort(self.engine)
        except Exception:   # a metrics refresh must never stop the engine thread
            log.exception("refreshing the metrics after an abort failed")

    def _deliver(self, rec) -> None:
        eng = self.engine
        for ev in rec.token_events:
            sink = self._sinks.get(ev.request_id)
            if sink is None:
                continue
            req = eng.request(ev.request_id)
            new = req.output_token_ids[sink.sent:]
            sink.sent += len(new)
            finish = None
            if req.status.finished:
                finish = "stop" if req.status is Status.FINISHED_STOPPED else "length"
            sink.put(("tokens", list(new), ev.t_s, finish))
            if finish is not None:
                self.stats.finished += 1
                self._forget(ev.request_id, abort=False)

    def _forget(self, rid: str, *, abort: bool) -> None:
        """Drop the request's sink and the engine's record of it (a long-running server must not grow)."""
        self._sinks.pop(rid, None)
        if abort:
            self.engine.abort(rid)   # frees its KV blocks
        # Engine keeps finished requests for offline runs' summaries; a server has delivered them.
        self.engine._finished.pop(rid, None)
