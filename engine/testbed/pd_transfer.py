"""Prefill/decode disaggregation: a prefill worker process computes prompt KV and ships the bytes.

The decode engine (this process) hands a disaggregated request's prompt to :class:`PDTransfer`; a
prefill worker *process* (same model config, so the same deterministic weights) runs the prompt
through the model and sends the K/V of its first ``n - 1`` tokens back over a TCP socket on
127.0.0.1. The decode engine installs those bytes into the request's paged KV blocks and schedules
the last prompt token as a 1-token EXTEND, whose logits give the first output token - so the
request's first step on the decode side is the step that installs its KV.

Transfer modes (``PDConfig.mode``):

* ``sync``: when the worker announces a request's KV, the decode loop pulls the bytes itself and
  blocks its step until they are in (the latency a PD transfer can put on running decodes);
* ``overlap``: a background thread pulls and receives into a staging buffer while decode steps
  run; the step only copies the staged KV into the cache.

``link_bytes_per_s`` paces the sender like a network link of that bandwidth (0 = as fast as the
loopback goes); pacing starts at the pull. Wire format, both directions: a 4-byte big-endian header
length, a JSON header (job, ``kv_ready`` announcement, ``pull``, ``kv``, ``stop``), and after a
``kv`` header ``nbytes`` raw bytes of a [layers, 2, n, kv_heads, head_dim] tensor.
"""
from __future__ import annotations

import json
import math
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

PD_MODES = ("sync", "overlap")
_CHUNK = 1 << 16  # bytes per (paced) send


@dataclass(frozen=True)
class PDConfig:
    """How KV travels from the prefill worker to the decode engine."""

    mode: str = "sync"
    link_bytes_per_s: float = 0.0   # pace the sender to this bandwidth; 0 = unpaced loopback
    prefill_chunk_tokens: int = 1024
    worker_threads: int = 1
    connect_timeout_s: float = 120.0

    def __post_init__(self):
        if self.mode not in PD_MODES:
            raise ValueError(f"pd.mode must be one of {', '.join(PD_MODES)}, got {self.mode!r}")
        if not (isinstance(self.link_bytes_per_s, (int, float)) and self.link_bytes_per_s >= 0):
            raise ValueError(f"pd.link_bytes_per_s must be >= 0, got {self.link_bytes_per_s!r}")
        for name in ("prefill_chunk_tokens", "worker_threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"pd.{name} must be a positive integer, got {v!r}")
        if not self.connect_timeout_s > 0:
            raise ValueError(f"pd.connect_timeout_s must be > 0, got {self.connect_timeout_s!r}")


@dataclass(frozen=True)
class ReceivedKV:
    """KV of one request's first ``n_tokens`` prompt tokens, as received from the prefill worker."""

    request_id: str
    kv: torch.Tensor       # [layers, 2, n_tokens, kv_heads, head_dim]
    nbytes: int            # bytes that crossed the socket
    transfer_s: float      # time the receiver spent reading them (sync: the decode loop blocked this long)
    prefill_s: float       # compute time on the prefill worker

    @property
    def n_tokens(self) -> int:
        return self.kv.shape[2]


def kv_nbytes(model_cfg, n_tokens: int) -> int:
    """Bytes of K and V for ``n_tokens`` tokens over all layers of ``model_cfg``."""
    return n_tokens * model_cfg.kv_bytes_per_token


@dataclass
class PromptBatch:
    """A one-request flat token stream (the fields the model's forward reads)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    logits_indices: torch.Tensor


def compute_prompt_kv(model, token_ids: list[int], chunk_tokens: int = 1024, block_size: int = 16) -> torch.Tensor:
    """Run ``token_ids`` through ``model`` (in chunks) and return their KV [L, 2, n, Hkv, D]."""
    cfg = model.config
    n = len(token_ids)
    dev = next(model.parameters()).device
    nb = max(1, -(-n // block_size))
    cache = torch.zeros(cfg.num_layers, 2, nb, block_size, cfg.num_kv_heads, cfg.head_dim,
                        dtype=getattr(torch, cfg.dtype), device=dev)
    ids = torch.tensor(token_ids, dtype=torch.long, device=dev)
    table = torch.arange(nb, dtype=torch.int32, device=dev).unsqueeze(0)
    with torch.no_grad():
        for lo in range(0, n, chunk_tokens):
            hi = min(n, lo + chunk_tokens)
            pos = torch.arange(lo, hi, dtype=torch.long, device=dev)
            batch = PromptBatch(ids[lo:hi], pos, pos.clone(),
                                torch.tensor([0, hi - lo], dtype=torch.int32, device=dev),
                                torch.tensor([hi], dtype=torch.int32, device=dev), table,
                                torch.tensor([hi - lo - 1], dtype=torch.long, device=dev))
            model(batch, cache)
    return cache.view(cfg.num_layers, 2, nb * block_size, cfg.num_kv_heads, cfg.head_dim)[:, :, :n].contiguous()


def install_kv(kv_cache: torch.Tensor, block_ids: list[int], kv: torch.Tensor) -> None:
    """Copy ``kv`` [L, 2, n, Hkv, D] into positions 0..n-1 of a request with ``block_ids``.

    ``kv_cache`` is the pool [L, 2, num_blocks, block_size, Hkv, D]; position p lives at slot
    ``block_ids[p // block_size] * block_size + p % block_size``.
    """
    L, _, nblocks, bs, hkv, d = kv_cache.shape
    n = kv.shape[2]
    if len(block_ids) * bs < n:
        raise ValueError(f"{len(block_ids)} blocks of {bs} cannot hold {n} tokens")
    pos = torch.arange(n)
    slots = torch.tensor(block_ids, dtype=torch.long)[pos // bs] * bs + pos % bs
    flat = kv_cache.view(L, 2, nblocks * bs, hkv, d)
    flat.index_copy_(2, slots.to(kv_cache.device), kv.to(device=kv_cache.device, dtype=kv_cache.dtype))


# ---- wire ------------------------------------------------------------------------------------
def _send_msg(sock: socket.socket, header: dict, payload: memoryview | None = None, rate: float = 0.0) -> None:
    h = json.dumps(header).encode()
    sock.sendall(struct.pack("!I", len(h)) + h)
    if payload is None:
        return
    t0 = time.perf_counter()
    sent = 0
    total = len(payload)
    while sent < total:
        n = min(_CHUNK, total - sent)
        if rate > 0:  # pace like a link of this bandwidth: a chunk's last byte lands at (sent + n) / rate
            ahead = (sent + n) / rate - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
        sock.sendall(payload[sent:sent + n])
        sent += n


def _recv_exact(sock: socket.socket, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if n == 0:
            raise ConnectionError("prefill worker closed the connection mid-transfer")
        got += n


def _recv_header(sock: socket.socket) -> dict:
    raw = bytearray(4)
    _recv_exact(sock, memoryview(raw))
    (n,) = struct.unpack("!I", raw)
    body = bytearray(n)
    _recv_exact(sock, memoryview(body))
    return json.loads(body)


def _worker(port: int, model_cfg, cfg: PDConfig, block_size: int) -> None:
    """Prefill worker: compute prompt KV (a compute thread), announce it, stream it when pulled."""
    import queue

    from mixdiag.engine.model.model import build_model

    torch.set_num_threads(cfg.worker_threads)
    model = build_model(model_cfg)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send_lock = threading.Lock()
    store: dict[str, torch.Tensor] = {}
    jobs: queue.Queue = queue.Queue()

    def compute():
        while (job := jobs.get()) is not None:
            t0 = time.perf_counter()
            kv = compute_prompt_kv(model, job["token_ids"], cfg.prefill_chunk_tokens, block_size)
            raw = kv.view(torch.uint8).reshape(-1) if kv.numel() else torch.empty(0, dtype=torch.uint8)
            store[job["request_id"]] = raw
            try:
                with send_lock:
                    _send_msg(sock, {"kv_ready": job["request_id"], "shape": list(kv.shape), "dtype": model_cfg.dtype,
                                     "nbytes": int(raw.numel()), "prefill_s": time.perf_counter() - t0})
            except OSError:
                return

    worker = threading.Thread(target=compute, daemon=True)
    worker.start()
    with send_lock:
        _send_msg(sock, {"hello": True})
    try:
        while True:
            msg = _recv_header(sock)
            if msg.get("stop"):
                break
            if "pull" in msg:
                raw = store.pop(msg["pull"])
                with send_lock:
                    _send_msg(sock, {"kv": msg["pull"], "nbytes": int(raw.numel())}, memoryview(raw.numpy()),
                              cfg.link_bytes_per_s)
            else:
                jobs.put(msg)
    except OSError:  # the decode side closed (run over)
        pass
    finally:
        jobs.put(None)
        sock.close()


class PDTransfer:
    """The decode engine's end of a PD split: submit prompts, pull their KV when ready.

    The worker announces a request's KV when computed (``kv_ready``); the bytes move only when
    this side pulls them. ``sync``: :meth:`poll` pulls on the caller's thread and blocks until the
    bytes are in. ``overlap``: a receiver thread pulls as soon as KV is announced.
    """

    def __init__(self, model_cfg, config: PDConfig, block_size: int = 16):
        self.config = config
        self.model_cfg = model_cfg
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        lsock.settimeout(config.connect_timeout_s)
        port = lsock.getsockname()[1]
        self._proc = mp.get_context("spawn").Process(target=_worker, args=(port, model_cfg, config, block_size),
                                                     daemon=True)
        self._proc.start()
        try:
            self._sock, _ = lsock.accept()
        except socket.timeout:
            self._proc.kill()
            raise RuntimeError("the prefill worker did not connect") from None
        finally:
            lsock.close()
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not _recv_header(self._sock).get("hello"):
            raise RuntimeError("the prefill worker did not say hello")
        self.pending: dict[str, int] = {}        # request_id -> prompt tokens whose KV is expected
        self._announced: list[dict] = []         # kv_ready headers not pulled yet
        self._staged: list[ReceivedKV] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = None
        if config.mode == "overlap":
            self._thread = threading.Thread(target=self._receive_loop, name="pd-receiver", daemon=True)
            self._thread.start()

    def _send(self, header: dict) -> None:
        with self._send_lock:
            _send_msg(self._sock, header)

    # ---- sending -----------------------------------------------------------------------------
    def submit(self, request_id: str, prompt_token_ids: list[int]) -> int:
        """Ask the prefill worker for the KV of the prompt's first n-1 tokens; returns n-1."""
        if len(prompt_token_ids) < 2:
            raise ValueError("a disaggregated prompt needs at least 2 tokens (n-1 of them are transferred)")
        ids = list(prompt_token_ids[:-1])
        self.pending[request_id] = len(ids)
        self._send({"request_id": request_id, "token_ids": ids})
        return len(ids)

    # ---- receiving ---------------------------------------------------------------------------
    def _pull(self, ready: dict) -> ReceivedKV:
        """Pull one announced transfer and read its bytes (announcements met meanwhile are queued)."""
        rid = ready["kv_ready"]
        t0 = time.perf_counter()
        self._send({"pull": rid})
        while True:
            hdr = _recv_header(self._sock)
            if "kv_ready" in hdr:
                self._announced.append(hdr)
                continue
            break
        if hdr.get("kv") != rid:
            raise RuntimeError(f"PD transfer: expected KV of {rid}, got {hdr}")
        buf = torch.empty(int(hdr["nbytes"]), dtype=torch.uint8)
        _recv_exact(self._sock, memoryview(buf.numpy()))
        kv = buf.view(getattr(torch, ready["dtype"])).view(ready["shape"])
        return ReceivedKV(rid, kv, int(hdr["nbytes"]), time.perf_counter() - t0, float(ready["prefill_s"]))

    def _drain_announcements(self, block: bool, timeout_s: float | None) -> None:
        """Sync mode: read every kv_ready waiting on the socket (optionally wait for the first)."""
        t = None if block else 0.0
        if block and timeout_s is not None:
            t = timeout_s
        while select.select([self._sock], [], [], t)[0]:
            hdr = _recv_header(self._sock)
            if "kv_ready" not in hdr:
                raise RuntimeError(f"PD transfer: unexpected message {hdr}")
            self._announced.append(hdr)
            t = 0.0

    def _receive_loop(self) -> None:
        try:
            while True:
                hdr = _recv_header(self._sock)
                if "kv_ready" in hdr:
                    self._announced.append(hdr)
                    with self._send_lock:
                        _send_msg(self._sock, {"pull": hdr["kv_ready"]})
                    continue
                ready = next(a for a in self._announced if a["kv_ready"] == hdr.get("kv"))
                self._announced.remove(ready)
                t0 = time.perf_counter()
                buf = torch.empty(int(hdr["nbytes"]), dtype=torch.uint8)
                _recv_exact(self._sock, memoryview(buf.numpy()))
                kv = buf.view(getattr(torch, ready["dtype"])).view(ready["shape"])
                item = ReceivedKV(ready["kv_ready"], kv, int(hdr["nbytes"]), time.perf_counter() - t0,
                                  float(ready["prefill_s"]))
                with self._lock:
                    self._staged.append(item)
        except (ConnectionError, OSError, ValueError, StopIteration) as e:
            if not self._closed:
                self._error = e

    def poll(self, wait: bool = False, timeout_s: float | None = None) -> list[ReceivedKV]:
        """Transfers complete now. sync: pull every announced one here (blocking on the bytes);
        overlap: take what the receiver thread finished.

        With ``wait``, first block until at least one is ready (or ``timeout_s`` passes) when any is pending.
        """
        if self._error is not None:
            raise RuntimeError(f"PD receiver failed: {self._error}")
        out: list[ReceivedKV] = []
        if self.config.mode == "overlap":
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while True:
                with self._lock:
                    out, self._staged = self._staged, []
                if out or not wait or not self.pending or (deadline is not None and time.monotonic() > deadline):
                    break
                time.sleep(0.001)
        else:
            self._drain_announcements(block=wait and bool(self.pending) and not self._announced, timeout_s=timeout_s)
            while self._announced:
                out.append(self._pull(self._announced.pop(0)))
        for item in out:
            expected = self.pending.pop(item.request_id, None)
            if expected is not None and expected != item.n_tokens:
                raise RuntimeError(f"PD transfer for {item.request_id} carried {item.n_tokens} tokens, "
                                   f"expected {expected}")
        return out

    def ready_count(self) -> int:
        """Announced (computed) transfers not yet received (sync mode; reads the socket, no bytes)."""
        if self.config.mode == "sync":
            self._drain_announcements(block=False, timeout_s=None)
        return len(self._announced)

    # ---- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the worker (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            _send_msg(self._sock, {"stop": True})
        except OSError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def expected_transfer_bytes(model_cfg, prompt_lens: list[int]) -> int:
    """KV bytes a PD run must ship for prompts of these lengths (n-1 tokens each)."""
    return sum(kv_nbytes(model_cfg, n - 1) for n in prompt_lens)


def transfer_summary(received: list[ReceivedKV]) -> dict:
    """Totals over received transfers: bytes, seconds, and the effective bandwidth."""
    b = sum(r.nbytes for r in received)
    s = sum(r.transfer_s for r in received)
    return {"bytes": b, "seconds": s, "bytes_per_s": b / s if s > 0 else math.nan, "transfers": len(received)}
