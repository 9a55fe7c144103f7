"""The launch call of each device item (collectors/traces/steps/activity_frame.py: ``launch_index``): the
runtime call with the same process and correlation id, -1 when none - the same answer whether the ids are
dense enough for the direct table or looked up by sorting."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mixdiag.collectors.traces.steps.activity import Activity, Calls, Items
from mixdiag.collectors.traces.steps.activity_frame import launch_index


def _activity(call_grp, call_corr, item_grp, item_corr) -> Activity:
    n, m = len(item_grp), len(call_grp)
    z = np.zeros(n, dtype=np.int64)
    items = Items(np.array(item_grp, dtype=np.int64), z, z + 1, z, z, np.array(item_corr, dtype=np.int64),
                  z, z, z, z, z)
    zc = np.zeros(m, dtype=np.int64)
    calls = Calls(np.array(call_grp, dtype=np.int64), zc, np.arange(m, dtype=np.int64), zc, np.array(call_corr, dtype=np.int64), zc)
    return Activity(items, calls, pd.DataFrame())


def _naive(call_grp, call_corr, item_grp, item_corr) -> list[int]:
    first = {}
    for i, key in enumerate(zip(call_grp, call_corr)):
        first.setdefault(key, i)
    return [first.get((g, c), -1) if c >= 0 else -1 for g, c in zip(item_grp, item_corr)]


@pytest.mark.parametrize("calls, items", [
    (([7] * 5, [1, 2, 3, 4, 5]), ([7] * 6, [5, 1, 9, -1, 3, 0])),                  # one process, dense ids: table
    (([7] * 4, [1, 2, 2, 4]), ([7] * 3, [2, 4, 3])),                               # a repeated id: sorted path
    (([7] * 3, [1, 10**9, 5]), ([7] * 3, [10**9, 5, 2])),                          # sparse ids: sorted path
    (([7, 7, 8, 8], [1, 2, 1, 2]), ([8, 7, 9, 8], [1, 2, 1, -1])),                 # two processes
    (([7, 7], [-1, 3]), ([7, 7], [-1, 3])),                                        # a call without an id
])
def test_launch_index_is_the_call_with_the_same_process_and_correlation_id(calls, items):
    got = launch_index(_activity(*calls, *items))
    assert got.tolist() == _naive(*calls, *items)
