"""Injecting a :class:`~.faults.FaultsConfig` into a running :class:`~.engine.Engine`.

:class:`FaultInjector` wires each fault in (EP group, PD connector, launch-cost hooks, host-stall
hook) and records what it did per step (:class:`FaultState`) for :mod:`.truth`. What each fault
does is described in :mod:`.faults`.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

from .expert_parallel import EPConfig, ExpertParallel, hotspot_bias, imbalance
from .faults import FaultsConfig, GraphMiss, PDFault, _in
from .graph_dispatch import plan_graph
from .pd_transfer import PDConfig, PDTransfer, install_kv


class PDConnector:
    """The engine's ``kv_connector``: remote prefill requests wait here until their KV is installed."""

    def __init__(self, engine, fault: PDFault):
        self.engine = engine
        self.transfer = PDTransfer(engine.config.model, PDConfig(mode=fault.mode,
                                                                 link_bytes_per_s=fault.link_bytes_per_s),
                                   engine.config.cache.block_size)
        self.waiting: dict[str, object] = {}      # request id -> Request, KV not yet installed
        self.installed_last_step: list[str] = []
        self._ready: list = []                     # read while the engine idled, installed next step
        self.total_bytes = 0
        self.transferred_prompt_lens: list[int] = []

    def submit(self, req) -> None:
        self.transfer.submit(req.request_id, req.prompt_token_ids)
        self.waiting[req.request_id] = req

    def has_pending(self) -> bool:
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
        self.transfer.close()


class _LaunchCost:
    """Host pause per eager module call, by the step's planned graph mode (see module doc)."""

    def __init__(self, engine, fault: GraphMiss):
        self.engine = engine
        self.cost = fault.launch_overhead_s
        self.mode = "NONE"
        self.launches = 0
        self._handles = [engine.model.register_forward_pre_hook(self._on_forward)]
        for name, mod in engine.model.named_modules():
            if not list(mod.children()):
                in_attn = ".attn." in f".{name}."
                self._handles.append(mod.register_forward_pre_hook(self._leaf_hook(in_attn)))

    def _on_forward(self, model, args):
        batch = args[0]
        sched = self.engine.scheduler
        nst = (batch.query_start_loc[1:] - batch.query_start_loc[:-1]).tolist()
        all_decode = all(sched.requests[r].is_decode for r in batch.req_ids if r in sched.requests)
        self.mode = plan_graph(nst, all_decode, self.engine.config.scheduler).mode
        if self.mode == "FULL":
            self._pause()  # one graph replay: one launch

    def _leaf_hook(self, in_attn: bool):
        def hook(mod, args):
            if self.mode == "NONE" or (self.mode == "PIECEWISE" and in_attn):
                self._pause()
        return hook

    def _pause(self) -> None:
        # A launch is host CPU work, so spin rather than sleep (a sleep's wake-up on a busy
        # machine costs more than the pause itself).
        self.launches += 1
        end = time.perf_counter() + self.cost
        while time.perf_counter() < end:
            pass

    def close(self) -> None:
        for h in self._handles:
            h.remove()


@dataclass
class FaultState:
    """What the injector did, per step, for ground truth (:mod:`.truth`)."""

    stalled_steps: dict[int, float] = field(default_factory=dict)   # step -> seconds stalled before it
    ep_steps: set[int] = field(default_factory=set)                 # steps run with the hotspot bias


class FaultInjector:
    """Wire a :class:`FaultsConfig` into a built :class:`~.engine.Engine` (hooks, EP group, PD worker).

    Build the engine from ``faults.apply(config)``; call :meth:`close` when done (it stops the
    worker processes).
    """

    def __init__(self, engine, faults: FaultsConfig):
        self.engine = engine
        self.faults = faults
        self.state = FaultState()
        self.ep: ExpertParallel | None = None
        self.pd: PDConnector | None = None
        self._launch: _LaunchCost | None = None
        self._added = 0
        try:
            if faults.ep_hotspot is not None:
                f = faults.ep_hotspot
                self.ep = ExpertParallel.attach(engine.model, EPConfig(world_size=f.world_size,
                                                                      capacity_factor=f.capacity_factor))
                moe = engine.model.moe_layers[0]
                self._bias = hotspot_bias(moe.num_experts, f.world_size, f.hot_rank, f.strength)
                self._bias_on = False
                self._ep_fill = self._ep_after
                engine.before_step.append(self._ep_before)
                engine.observers.insert(0, self._ep_fill)
            if faults.pd_transfer is not None:
                self.pd = PDConnector(engine, faults.pd_transfer)
                engine.kv_connector = self.pd
                engine.before_step.append(self.pd.wait_if_idle)
            if faults.graph_miss is not None and engine.device.type != "cuda":
                # On CUDA eager steps pay real kernel launches; the cost model is for CPU only.
                self._launch = _LaunchCost(engine, faults.graph_miss)
            if faults.host_stall is not None:
                engine.before_step.append(self._stall)
        except BaseException:
            self.close()
            raise

    # ---- requests --------------------------------------------------------------------------
    def add_request(self, prompt_token_ids, params=None, **kw) -> str:
        """``engine.add_request``, sending every ``pd_transfer.every``-th request to the prefill worker."""
        f = self.faults.pd_transfer
        remote = False
        rid = str(kw.get("request_id", ""))
        if f is not None and (not f.groups or rid.rsplit("-", 1)[0] in f.groups):
            remote = self._added % f.every == 0 and len(prompt_token_ids) >= f.min_prompt_tokens
            self._added += 1
        if remote:
            kw["remote_prefill"] = True
        return self.engine.add_request(prompt_token_ids, params, **kw)

    # ---- hooks -----------------------------------------------------------------------------
    def _ep_before(self, step: int) -> None:
        obs = self.engine.observers
        if not obs or obs[0] is not self._ep_fill:
            # It fills expert_imbalance, so it must run before observers that read the record
            # (metrics, log lines), whatever was attached after the injector.
            obs[:] = [self._ep_fill] + [o for o in obs if o is not self._ep_fill]
        on = _in(self.faults.ep_hotspot.windows, step)
        if on != self._bias_on:
            self.ep.set_router_bias(self._bias if on else None)
            self._bias_on = on
        if on:
            self.state.ep_steps.add(step)
        self.ep.take_step_counts()  # nothing should count outside a step

    def _ep_after(self, rec) -> None:
        counts, _ = self.ep.take_step_counts()
        if sum(counts):
            rec.per_rank_tokens = counts
            rec.expert_imbalance = imbalance(counts)

    def _stall(self, step: int) -> None:
        f = self.faults.host_stall
        hit = [a for a, b in f.windows if a <= step < b]
        if not hit or (step - hit[0]) % f.every:
            return
        t0 = time.perf_counter()
        if f.how == "sleep":
            time.sleep(f.stall_s)
        else:
            junk = []
            for _ in range(f.garbage_objects):
                a: list = []
                a.append(a)              # a reference cycle only the cyclic GC can free
                junk.append(a)
            del junk, a
            gc.collect()
        self.state.stalled_steps[step] = time.perf_counter() - t0

    # ---- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop EP workers and the prefill worker, remove hooks (idempotent)."""
        if self._launch is not None:
            self._launch.close()
            self._launch = None
        if self.ep is not None:
            self.ep.close()
            self.ep = None
        if self.pd is not None:
            # The connector stays attached: requests still waiting for KV remain findable.
            self.pd.close()
            self.pd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

