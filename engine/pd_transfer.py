"""Prefill/decode disaggregation: a prefill worker process computes prompt KV and ships the bytes.

The decode engine (this process) hands a disaggregated request's prompt to :class:`PDTransfer`; a
prefill worker *process* (same model config, so the same deterministic weights) runs the prompt
through the model and sends the K/V of its first ``n - 1`` tokens back over a TCP socket on
127.0.0.1. The decode engine installs those bytes into the request's paged KV blocks and schedules
the last prompt token as a 1-token EXTEND, whose logits give the first output token - so the
request's first step on the decode side is the step that installs its KV.

Transfer modes (``PDConfig.mode``):

* ``sync``: the decode loop reads the bytes itself when a transfer is ready, blocking its next
  step for the whole transfer (the latency a PD transfer can put on running decodes);
* ``overlap``: a background thread receives into a staging buffer while decode steps run; the
  step only copies the staged KV into the cache.

``link_bytes_per_s`` paces the sender like a network link of that bandwidth (0 = as fast as the
loopback goes). Wire format, both directions: a 4-byte big-endian header length, a JSON header,
then (worker -> decode) ``nbytes`` raw bytes of a [layers, 2, n, kv_heads, head_dim] tensor.
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
    """Prefill worker: build the same model, then serve prompt -> KV jobs until the socket closes."""
    from .model import build_model

    torch.set_num_threads(cfg.worker_threads)
    model = build_model(model_cfg)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _send_msg(sock, {"ready": True})
    try:
        while True:
            try:
                job = _recv_header(sock)
            except ConnectionError:
                break
            if job.get("stop"):
                break
            t0 = time.perf_counter()
            kv = compute_prompt_kv(model, job["token_ids"], cfg.prefill_chunk_tokens, block_size)
            prefill_s = time.perf_counter() - t0
            raw = kv.view(torch.uint8).reshape(-1) if kv.numel() else torch.empty(0, dtype=torch.uint8)
            _send_msg(sock, {"request_id": job["request_id"], "shape": list(kv.shape), "dtype": model_cfg.dtype,
                             "nbytes": int(raw.numel()), "prefill_s": prefill_s},
                      memoryview(raw.numpy()), cfg.link_bytes_per_s)
    finally:
        sock.close()


class PDTransfer:
    """The decode engine's end of a PD split: submit prompts, collect their KV (sync or overlapped)."""

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
        if not _recv_header(self._sock).get("ready"):
            raise RuntimeError("the prefill worker did not report ready")
        self.pending: dict[str, int] = {}        # request_id -> prompt tokens whose KV is expected
        self._staged: list[ReceivedKV] = []
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = None
        if config.mode == "overlap":
            self._thread = threading.Thread(target=self._receive_loop, name="pd-receiver", daemon=True)
            self._thread.start()

    # ---- sending -----------------------------------------------------------------------------
    def submit(self, request_id: str, prompt_token_ids: list[int]) -> int:
        """Ask the prefill worker for the KV of the prompt's first n-1 tokens; returns n-1."""
        if len(prompt_token_ids) < 2:
            raise ValueError("a disaggregated prompt needs at least 2 tokens (n-1 of them are transferred)")
        ids = list(prompt_token_ids[:-1])
        _send_msg(self._sock, {"request_id": request_id, "token_ids": ids})
        self.pending[request_id] = len(ids)
        return len(ids)

    # ---- receiving ---------------------------------------------------------------------------
    def _read_one(self) -> ReceivedKV:
        hdr = _recv_header(self._sock)
        t0 = time.perf_counter()
        buf = torch.empty(int(hdr["nbytes"]), dtype=torch.uint8)
        _recv_exact(self._sock, memoryview(buf.numpy()))
        kv = buf.view(getattr(torch, hdr["dtype"])).view(hdr["shape"])
        return ReceivedKV(hdr["request_id"], kv, int(hdr["nbytes"]), time.perf_counter() - t0, float(hdr["prefill_s"]))

    def _receive_loop(self) -> None:
        try:
            while True:
                item = self._read_one()
                with self._lock:
                    self._staged.append(item)
        except (ConnectionError, OSError, ValueError) as e:
            if not self._closed:
                self._error = e

    def poll(self, wait: bool = False, timeout_s: float | None = None) -> list[ReceivedKV]:
        """Transfers that are complete (overlap) or ready to read (sync: read now, blocking).

        With ``wait``, block until at least one arrives (or ``timeout_s`` passes) when any is pending.
        """
        if self._error is not None:
            raise RuntimeError(f"PD receiver failed: {self._error}")
        out: list[ReceivedKV] = []
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self.config.mode == "overlap":
                with self._lock:
                    out, self._staged = self._staged, []
            else:
                while self.pending and select.select([self._sock], [], [], 0)[0]:
                    out.append(self._read_one())
            if out or not wait or not self.pending:
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            if self.config.mode == "overlap":
                time.sleep(0.001)
            else:
                select.select([self._sock], [], [], None if deadline is None else max(0.0, deadline - time.monotonic()))
        for item in out:
            expected = self.pending.pop(item.request_id, None)
            if expected is not None and expected != item.n_tokens:
                raise RuntimeError(f"PD transfer for {item.request_id} carried {item.n_tokens} tokens, "
                                   f"expected {expected}")
        return out

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
