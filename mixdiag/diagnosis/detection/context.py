"""What detection learns of an instance as a whole, for the rules to read beside each spike row."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class InstanceContext:
    """What attribution needs to know about the spike's instance as a whole."""

    quality: dict            # signal -> measured | estimated | inferred | absent
    graph_norm: str          # graph mode decode-only steps normally run in
    period: dict             # signals.periodicity(...) against arrivals (never the token counts)
    full_batch_sizes: frozenset = frozenset()  # decode_reqs values seen replaying FULL
    relation: dict = field(default_factory=dict)  # interval rows: signals.rank_relation(work, ITL excess)
    llm_like: bool = True    # the input has decode-like structure (signals.looks_like_llm_serving)
