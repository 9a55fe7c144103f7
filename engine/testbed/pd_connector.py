"""The decode engine's side of a PD split: the ``kv_connector`` that submits prompts to a
:class:`~.pd_transfer.PDTransfer`, installs the KV that comes back into the paged cache and queues
the request for its first (1-token EXTEND) step.

:class:`~.faults.FaultInjector` attaches one for the ``pd_transfer`` fault; the engine only sees
the ``kv_connector`` duck type (``submit``, ``has_pending``, ``waiting``, ``receive``).
May import: the standard library and :mod:`.pd_transfer`.
"""
from __future__ import annotations

import time

from mixdiag.engine.testbed.pd_transfer import PDConfig, PDTransfer, install_kv


class PDConnector:
    """The engine's ``kv_connector``: remote prefill requests wait here until their KV is installed."""

    def __init__(self, engine, config: PDConfig):
        self.engine = engine
        self.transfer = PDTransfer(engine.config.model, config, engine.config.cache.block_size)
        self.waiting: dict[str, object] = {}      # request id -> Request, KV not yet installed
        self.installed_last_step: list[str] = []
        self._ready: list = []                     # read while the engine idled, installed next step
        self.total_bytes = 0
        self.transferred_prompt_lens: list[int] = []

    def submit(self, req) -> None:
        """Send ``req``'s prompt to the prefill worker; the request waits here until its KV arrives."""
        self.transfer.submit(req.request_id, req.prompt_token_ids)
        self.waiting[req.request_id] = req

    def has_pending(self) -> bool:
        """True while a submitted request still waits for its KV."""
        return bool(self.waiting)

    def wait_if_idle(self, step: int) -> None:
        """before_step hook: with nothing else to run, wait (outside the step) for a transfer."""
        if self.waiting and not self.engine.scheduler.has_unfinished():
            self._ready = self.transfer.poll(wait=True, timeout_s=120)
        else:
            self._ready = []

    def receive(self) -> tuple[int, float]:
        """In the step: read (sync) or take (overlap) arrived KV, install it, queue the requests.

        Returns (bytes, seconds) the step spent on the transfer.
        """
        t0 = time.perf_counter()
        got = self._ready + self.transfer.poll()
        self._ready = []
        eng = self.engine
        nbytes = 0
        self.installed_last_step = []
        for item in got:
            req = self.waiting.pop(item.request_id)
            if not eng.kv_manager.allocate_slots(req, item.n_tokens):
                # No room for the transferred KV: fall back to computing the prompt here.
                eng.scheduler.add_request(req)
                continue
            install_kv(eng.kv_cache, eng.kv_manager.get_block_ids(req.request_id), item.kv)
            req.num_computed_tokens = item.n_tokens
            eng.scheduler.add_request(req)
            nbytes += item.nbytes
            self.total_bytes += item.nbytes
            self.transferred_prompt_lens.append(req.num_prompt_tokens)
            self.installed_last_step.append(req.request_id)
        # sync: reading the bytes happened here, inside the step; overlap: only the install did
        return nbytes, (time.perf_counter() - t0 if got else 0.0)

    def close(self) -> None:
        """Stop the prefill worker and its sockets."""
        self.transfer.close()
