"""Faults that really happen: the ``[faults]`` table of a scenario, and their injection into an engine.

Each fault does the work that makes latency rise - nothing edits a timestamp:

* ``ep_hotspot``: MoE experts sharded over ``world_size`` processes (:mod:`.expert_parallel`); in
  the windows the router bias favours one rank's experts, so that rank receives most rows and the
  all-to-all rounds multiply.
* ``pd_transfer``: every ``every``-th request (of the workload ``groups`` listed, or of all) is
  prefilled by a worker process and its KV bytes shipped over a socket (:mod:`.pd_transfer`),
  ``sync`` (the decode loop reads them) or ``overlap`` (a receiver thread does).
* ``graph_miss``: the captured CUDA-graph sizes stop below the decode batch sizes the workload
  reaches. On CPU there are no kernel launches for a graph to save, so the fault also turns on
  a launch-cost model: every eager module call (all of them for ``NONE``, attention for
  ``PIECEWISE``) keeps the host busy for ``launch_overhead_s``, a replayed ``FULL`` step pays once -
  the host-side cost eager kernels pay on a GPU. On CUDA the model is off: launches are real there.
* ``kv_pressure``: a KV pool of ``num_blocks`` blocks, small enough that running requests are
  preempted and recomputed.
* ``host_stall``: in the windows, a pause before the step: ``sleep`` for ``stall_s``, or ``gc``:
  build ``garbage_objects`` reference cycles (a leaking detokenizer) and force a full collection.

Windows are ``[start, end)`` step numbers. Bad values raise :class:`~.config.ConfigError` (one line).
Injection into a running engine: :class:`FaultInjector` wires each fault in (EP group, PD connector,
launch-cost hooks, host-stall hook) and records what it did per step (:class:`FaultState`) for :mod:`.truth`.
"""
from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass, field

from mixdiag.engine.config import ConfigError, EngineConfig
from mixdiag.engine.model.graph_dispatch import plan_graph
from mixdiag.engine.testbed.expert_parallel import EPConfig, ExpertParallel, hotspot_bias, imbalance
from mixdiag.engine.testbed.pd_connector import PDConnector
from mixdiag.engine.testbed.pd_transfer import PDConfig

Window = tuple[int, int]


def _windows(name: str, value) -> tuple[Window, ...]:
    try:
        out = tuple((int(a), int(b)) for a, b in value)
    except (TypeError, ValueError):
        raise ConfigError(f"faults.{name}.windows must be a list of [start, end) step pairs, got {value!r}") from None
    for a, b in out:
        if not 0 <= a < b:
            raise ConfigError(f"faults.{name}.windows: need 0 <= start < end, got [{a}, {b}]")
    return out


def _in(windows: tuple[Window, ...], step: int) -> bool:
    return any(a <= step < b for a, b in windows)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True)
class EPHotspot:
    world_size: int = 4
    capacity_factor: float = 1.5
    hot_rank: int = 1
    strength: float = 8.0            # added to the hot rank's experts' router logits
    windows: tuple[Window, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "windows", _windows("ep_hotspot", self.windows))
        _need(0 <= self.hot_rank < self.world_size,
              f"faults.ep_hotspot.hot_rank must be in [0, world_size={self.world_size}), got {self.hot_rank}")
        _need(self.strength >= 0, f"faults.ep_hotspot.strength must be >= 0, got {self.strength}")
        try:
            EPConfig(world_size=self.world_size, capacity_factor=self.capacity_factor)
        except ValueError as e:
            raise ConfigError(f"faults.{e}") from None


@dataclass(frozen=True)
class PDFault:
    mode: str = "sync"
    every: int = 1                   # every k-th added request is prefilled remotely
    link_bytes_per_s: float = 0.0
    min_prompt_tokens: int = 2       # shorter prompts stay local
    groups: tuple[str, ...] = ()     # only requests of these workload groups (ids "<group>-<i>"); () = all

    def __post_init__(self):
        object.__setattr__(self, "groups", tuple(self.groups))
        _need(isinstance(self.every, int) and self.every >= 1, f"faults.pd_transfer.every must be >= 1, got {self.every!r}")
        _need(self.min_prompt_tokens >= 2, "faults.pd_transfer.min_prompt_tokens must be >= 2")
        try:
            self.transfer_config()
        except ValueError as e:
            raise ConfigError(f"faults.{e}") from None

    def transfer_config(self) -> PDConfig:
        """The :class:`PDConfig` of the transfer this fault runs."""
        return PDConfig(mode=self.mode, link_bytes_per_s=self.link_bytes_per_s)


@dataclass(frozen=True)
class GraphMiss:
    capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    launch_overhead_s: float = 0.0004  # host pause per eager module call (a kernel launch)

    def __post_init__(self):
        sizes = tuple(self.capture_sizes)
        _need(len(sizes) > 0 and all(isinstance(s, int) and s > 0 for s in sizes),
              f"faults.graph_miss.capture_sizes must be positive integers, got {sizes!r}")
        object.__setattr__(self, "capture_sizes", tuple(sorted(set(sizes))))
        _need(0 <= self.launch_overhead_s <= 0.1,
              f"faults.graph_miss.launch_overhead_s must be in [0, 0.1], got {self.launch_overhead_s}")


@dataclass(frozen=True)
class KVPressure:
    num_blocks: int = 256

    def __post_init__(self):
        _need(isinstance(self.num_blocks, int) and self.num_blocks > 0,
              f"faults.kv_pressure.num_blocks must be a positive integer, got {self.num_blocks!r}")


@dataclass(frozen=True)
class HostStall:
    windows: tuple[Window, ...] = ()
    how: str = "sleep"               # sleep | gc
    stall_s: float = 0.1
    every: int = 1                   # stall before every k-th step of a window
    garbage_objects: int = 400_000

    def __post_init__(self):
        object.__setattr__(self, "windows", _windows("host_stall", self.windows))
        _need(self.how in ("sleep", "gc"), f"faults.host_stall.how must be sleep or gc, got {self.how!r}")
        _need(0 < self.stall_s <= 10, f"faults.host_stall.stall_s must be in (0, 10], got {self.stall_s}")
        _need(isinstance(self.every, int) and self.every >= 1, "faults.host_stall.every must be >= 1")
        _need(isinstance(self.garbage_objects, int) and self.garbage_objects >= 0,
              "faults.host_stall.garbage_objects must be >= 0")


_SECTIONS = {"ep_hotspot": EPHotspot, "pd_transfer": PDFault, "graph_miss": GraphMiss, "kv_pressure": KVPressure,
             "host_stall": HostStall}


@dataclass(frozen=True)
class FaultsConfig:
    """Which faults a scenario injects (``None`` = off)."""

    ep_hotspot: EPHotspot | None = None
    pd_transfer: PDFault | None = None
    graph_miss: GraphMiss | None = None
    kv_pressure: KVPressure | None = None
    host_stall: HostStall | None = None
    #: fault name -> the engine instances it applies to (multi-instance scenarios); absent = all
    scope: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_dict(cls, table: dict | None) -> "FaultsConfig":
        """Parse the ``[faults]`` table (sub-tables named like the fields); unknown keys are errors."""
        table = dict(table or {})
        unknown = set(table) - set(_SECTIONS)
        if unknown:
            raise ConfigError(f"unknown fault {sorted(unknown)[0]!r} in [faults]; known: {', '.join(_SECTIONS)}")
        kw: dict = {}
        scope = []
        for name, klass in _SECTIONS.items():
            if name not in table:
                continue
            sub = table[name]
            if not isinstance(sub, dict):
                raise ConfigError(f"[faults.{name}] must be a table")
            sub = dict(sub)
            if "instances" in sub:
                inst = sub.pop("instances")
                if not (isinstance(inst, list) and inst and all(isinstance(i, str) and i for i in inst)):
                    raise ConfigError(f"[faults.{name}] instances must be a non-empty list of instance names")
                scope.append((name, tuple(inst)))
            fields = {f.name for f in dataclasses.fields(klass)}
            bad = set(sub) - fields
            if bad:
                raise ConfigError(f"unknown key {sorted(bad)[0]!r} in [faults.{name}]; known: {', '.join(sorted(fields))}")
            try:
                kw[name] = klass(**sub)
            except TypeError as e:
                raise ConfigError(f"[faults.{name}]: {e}") from None
        return cls(**kw, scope=tuple(scope))

    def for_instance(self, instance: str) -> "FaultsConfig":
        """The faults that apply to engine ``instance`` (those scoped to other instances are off)."""
        off = {n: None for n, inst in self.scope if instance not in inst}
        return dataclasses.replace(self, **off, scope=())

    @property
    def active(self) -> list[str]:
        """Names of the faults that are on."""
        return [n for n in _SECTIONS if getattr(self, n) is not None]

    def apply(self, config: EngineConfig) -> EngineConfig:
        """The engine config these faults need (captured graph sizes, KV pool size)."""
        if self.graph_miss is not None:
            config = dataclasses.replace(config, scheduler=dataclasses.replace(
                config.scheduler, cudagraph_capture_sizes=self.graph_miss.capture_sizes))
        if self.kv_pressure is not None:
            config = dataclasses.replace(config, cache=dataclasses.replace(
                config.cache, num_blocks=self.kv_pressure.num_blocks))
        return config


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
                self.pd = PDConnector(engine, faults.pd_transfer.transfer_config())
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

