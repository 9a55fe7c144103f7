"""console.json_text writes, byte for byte, what ``json.dumps(_clean(data), indent=2, allow_nan=False)``
wrote before it was built in one pass (the --json text of every analyze golden, and odd values)."""
import enum
import json
from pathlib import Path

import numpy as np
import pytest

from mixdiag.console import _clean, json_text

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"


def _reference(data) -> str:
    return json.dumps(_clean(data), indent=2, sort_keys=False, allow_nan=False) + "\n"


class _Level(enum.IntEnum):
    HIGH = 2


def _deep(levels: int):
    top = node = []
    for _ in range(levels):
        child = [1, {"a": [2.5]}]
        node.append(child)
        node = child
    return top


ODD = [
    {}, [], (), "text", 3, None, True, 1.5,
    {"empty": {}, "list": [], "tuple": (), "nested": [[], {}, [[]]]},
    [float("nan"), float("inf"), -float("inf"), -0.0, 1e16, 1e-7, 0.1 + 0.2, 2 ** 60, -(2 ** 70)],
    {"np": [np.float64(2.5), np.float64("nan"), np.int64(3), np.bool_(True), np.float32(0.1), np.array(4.0)]},
    {1: "int key", True: "bool key", None: "none key", 2.5: "float key", "é\n\"\\\t": "é\u2028\x00"},
    {"enum": _Level.HIGH, "str_subclass": type("S", (str,), {})("sub"), "list": [_Level.HIGH]},
    {"deep": _deep(70)},  # deeper than the indent table: handed to json.dumps itself
]


@pytest.mark.parametrize("data", ODD, ids=range(len(ODD)))
def test_odd_values_are_written_as_json_dumps_writes_them(data):
    assert json_text(data) == _reference(data)


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("analyze_*.json")), ids=lambda p: p.name)
def test_every_analyze_golden_is_written_back_byte_for_byte(golden):
    text = golden.read_text()
    assert json_text(json.loads(text)) == _reference(json.loads(text)) == text
