"""A second trace generator (issue 24 item 4), written from the engines' public behaviour.

It shares no code with ``mixdiag.collectors`` or ``helpers.foreign_trace`` (a test checks the
imports): shapes (``shapes.py``), seed-drawn fault schedules (``schedule.py``), kernel names and
costs (``kernels.py``), the step loop (``engine.py``) and the SQLite writer (``nsys_db.py``).
"""
from .generate import TRUTH_COLUMNS, GenConfig, Generated, generate
from .schedule import CAUSES, MAGNITUDE, Episode, Schedule, ScheduleConfig, draw_schedule
from .shapes import SHAPES, Shape

__all__ = ["CAUSES", "MAGNITUDE", "SHAPES", "TRUTH_COLUMNS", "Episode", "GenConfig", "Generated", "Schedule",
           "ScheduleConfig", "Shape", "draw_schedule", "generate"]
