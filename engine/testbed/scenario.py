"""Scenario files (TOML): model preset, KV cache, scheduler and its knobs, workload, seed, steps.

Loaded by name (a file shipped in ``engine/scenarios/``) or by path. Unknown keys are errors, so a
typo cannot silently fall back to a default. The format is documented in docs/scenarios.md.
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from mixdiag.errors import UserError

from mixdiag.engine.config import CacheConfig, ConfigError, EngineConfig, ModelConfig, SchedulerConfig
from mixdiag.engine.testbed.workload import LengthDist, RequestGroup, Workload

SCENARIO_DIR = Path(__file__).parent / "scenarios"
_TOP_KEYS = {"name", "description", "seed", "max_steps", "model", "cache", "scheduler", "workload", "engine", "faults",
             "instances"}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    max_steps: int
    engine: EngineConfig
    workload: Workload
    source: str               # the file it came from
    faults: dict = dataclasses.field(default_factory=dict)   # the raw [faults] table (see .faults)
    checkpoint: str | None = None     # local checkpoint directory ([model] checkpoint = "..."), else random weights
    instances: int = 1        # engines run side by side (engine0, engine1, ...; see .multi_instance)

    def with_seed(self, seed: int) -> "Scenario":
        """The same scenario under another seed (workload and sampling; model weights keep theirs)."""
        return dataclasses.replace(self, seed=seed, engine=dataclasses.replace(self.engine, seed=seed))


def available() -> list[str]:
    """Names of the scenarios shipped with mixdiag."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def _build(cls, data: dict, where: str):
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a table, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
    try:
        return cls(**data)
    except ConfigError as e:
        raise UserError(f"{where}: {e}") from None
    except TypeError as e:
        raise UserError(f"{where}: {e}") from None


def _group(data: dict, where: str) -> RequestGroup:
    data = dict(data)
    for key in ("prompt_len", "output_len"):
        if key in data:
            data[key] = _build(LengthDist, data[key], f"{where}.{key}")
    return _build(RequestGroup, data, where)


def resolve(name_or_path: str) -> Path:
    """The file of a scenario name or path; UserError listing the shipped names if neither exists."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise UserError(f"no such scenario file: {p}")
        return p
    shipped = SCENARIO_DIR / f"{name_or_path}.toml"
    if shipped.is_file():
        return shipped
    raise UserError(f"unknown scenario {name_or_path!r}; shipped scenarios: {', '.join(available())} "
                    "(or give a path to a .toml file)")


def load(name_or_path: str) -> Scenario:
    """Parse and validate a scenario (by shipped name or file path)."""
    path = resolve(name_or_path)
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML ({e})") from None
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise UserError(f"{path}: unknown top-level key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    model = dict(doc.get("model", {}))
    checkpoint = model.pop("checkpoint", None)
    if checkpoint is not None:
        # A local Llama/Qwen2-style checkpoint: its config.json fixes the shape (only dtype may change).
        from mixdiag.engine.model.checkpoint import read_config

        extra = sorted(set(model) - {"dtype"})
        if extra:
            raise UserError(f"{path} [model]: with checkpoint only 'dtype' may be set, not {', '.join(extra)}")
        checkpoint = str((path.parent / checkpoint).resolve())
        mcfg, _ = read_config(checkpoint, model.get("dtype"))
    else:
        preset = model.pop("preset", "tiny")
        try:
            mcfg = ModelConfig.preset(preset)
        except ConfigError as e:
            raise UserError(f"{path} [model]: {e}") from None
        mcfg = _build(ModelConfig, {**dataclasses.asdict(mcfg), **model}, f"{path} [model]")
    cache = _build(CacheConfig, doc.get("cache", {}), f"{path} [cache]")
    sched = dict(doc.get("scheduler", {}))
    if "cudagraph_capture_sizes" in sched:
        sched["cudagraph_capture_sizes"] = tuple(sched["cudagraph_capture_sizes"])
    scfg = _build(SchedulerConfig, sched, f"{path} [scheduler]")
    seed = doc.get("seed", 0)
    eng = _build(EngineConfig, {**doc.get("engine", {}), "model": mcfg, "cache": cache, "scheduler": scfg,
                                "seed": seed}, f"{path} [engine]")
    wl = dict(doc.get("workload", {}))
    groups = wl.pop("groups", None)
    if not groups:
        raise UserError(f"{path} [workload]: needs at least one [[workload.groups]] entry")
    wl["groups"] = tuple(_group(g, f"{path} [workload.groups.{i}]") for i, g in enumerate(groups))
    workload = _build(Workload, wl, f"{path} [workload]")
    max_steps = doc.get("max_steps", 1000)
    if not isinstance(seed, int) or not isinstance(max_steps, int) or max_steps < 1:
        raise UserError(f"{path}: seed must be an integer and max_steps a positive integer")
    faults = doc.get("faults", {})
    from mixdiag.engine.testbed.faults import FaultsConfig   # validates the table now, not minutes into a run

    try:
        FaultsConfig.from_dict(faults)
    except ConfigError as e:
        raise UserError(f"{path}: {e}") from None
    instances = doc.get("instances", 1)
    if not isinstance(instances, int) or isinstance(instances, bool) or not 1 <= instances <= 8:
        raise UserError(f"{path}: instances must be an integer in 1..8, got {instances!r}")
    return Scenario(name=doc.get("name", path.stem), description=doc.get("description", ""), seed=seed,
                    max_steps=max_steps, engine=eng, workload=workload, source=str(path), faults=faults,
                    instances=instances, checkpoint=checkpoint)
