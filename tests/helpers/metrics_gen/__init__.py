"""Tier (e2)'s independent generator of what a server operator has: timed /metrics scrapes (vLLM V1
and SGLang names) and operator logs, from a simulated engine timeline with fault schedules drawn
from the seed, with truth per step, per scrape interval and per log line (docs/analyze.md,
"Tier (e2)"). It imports nothing from mixdiag, the reference engine, helpers.foreign_trace or
helpers.trace_gen2 (tests/helpers/test_metrics_gen.py checks)."""
from .generate import DIALECTS, Capture, GenConfig, generate
from .schedule import CAUSES, Episode, ScheduleConfig, draw_schedule
from .truth import VISIBLE_SHARE, units

__all__ = ["CAUSES", "DIALECTS", "VISIBLE_SHARE", "Capture", "Episode", "GenConfig", "ScheduleConfig",
           "draw_schedule", "generate", "units"]
