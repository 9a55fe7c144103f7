"""Scheduling policies behind one interface (:class:`~.base.Scheduler`); :func:`make_scheduler` picks one."""
from __future__ import annotations

from mixdiag.engine.config import SchedulerConfig
from mixdiag.engine.core.schedulers.base import ForwardMode, Scheduler, SchedulerOutput, UpdateResult
from mixdiag.engine.core.schedulers.mix_running import MixRunningScheduler
from mixdiag.engine.core.schedulers.prefill_first import PrefillFirstScheduler
from mixdiag.engine.core.schedulers.token_budget import TokenBudgetScheduler

POLICIES: dict[str, type[Scheduler]] = {
    "token_budget": TokenBudgetScheduler,
    "mix_running": MixRunningScheduler,
    "prefill_first": PrefillFirstScheduler,
}


def make_scheduler(config: SchedulerConfig, kv_manager, max_model_len: int, eos_token_id: int) -> Scheduler:
    """The scheduler of ``config.policy``."""
    return POLICIES[config.policy](config, kv_manager, max_model_len, eos_token_id)


__all__ = ["ForwardMode", "Scheduler", "SchedulerOutput", "UpdateResult", "make_scheduler", "POLICIES",
           "TokenBudgetScheduler", "MixRunningScheduler", "PrefillFirstScheduler"]
