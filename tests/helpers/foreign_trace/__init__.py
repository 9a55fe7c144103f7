"""Foreign-trace simulator: Nsight/Kineto traces of vLLM-, SGLang- and EP-like engines with ground truth.

Independent of ``mixdiag.collectors`` and ``mixdiag.diagnosis`` by design (it tests them); uses only
numpy, pandas, sqlite3 and json. See docs/foreign-trace-simulator.md for every modelled behaviour.
"""
from .engines import ENGINES
from .planner import FAULTS
from .simulate import simulate
from .truth import CAUSES, Truth

__all__ = ["ENGINES", "FAULTS", "CAUSES", "Truth", "simulate"]
