"""A spike's predicted height from its batch shape: the ledger + device model applied to a spike's evidence.

The HTML report and the dashboard's Spike page both show this number; it lives here so both
compute it one way. Stdlib and the ledger only.
"""
from __future__ import annotations

import math

from mixdiag.ledger.device_model import DeviceModel, predict
from mixdiag.ledger.shapes import BatchShape, LedgerModel


def predicted_height(evidence: dict, model: LedgerModel, dev: DeviceModel, context_len: int) -> float:
    """Mixed over pure-decode step time for the spike step's shape (``prefill_tokens``, ``decode_rows``,
    ``decode_reqs`` in ``evidence``); NaN when the evidence holds no prefill/decode allocation."""
    p, rows, reqs = evidence.get("prefill_tokens"), evidence.get("decode_rows"), evidence.get("decode_reqs")
    if p is None or not rows:
        return math.nan
    reqs = int(reqs) if reqs else int(rows)
    # rows per request beyond the first are speculative tokens
    k = max(int(round(rows / reqs)) - 1, 0) if reqs else 0
    shape = BatchShape(prefill_tokens=int(p), decode_reqs=reqs, spec_tokens=k, context_len=int(context_len))
    return predict(model, shape, dev)["height_x"]
