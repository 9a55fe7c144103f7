"""The one latency formatter and the one HTML page shell the reports share."""
import math

import numpy as np
import pytest

from mixdiag.fmt import duration, ms
from mixdiag.html_page import page


@pytest.mark.parametrize("v,kw,want", [
    (0.01234, {}, "12.3 ms"),
    (0.01234, {"digits": 0}, "12 ms"),
    (0.01234, {"unit": ""}, "12.3"),
    (np.float64(0.5), {"unit": "ms"}, "500.0ms"),
    (2, {}, "2000.0 ms"),
    (None, {}, "-"),
    (math.nan, {}, "-"),
    (math.inf, {"unit": ""}, "-"),
    (np.float32("nan"), {}, "-"),
])
def test_ms(v, kw, want):
    assert ms(v, **kw) == want


@pytest.mark.parametrize("v,want", [(0.0123, "12.3 ms"), (-0.5, "-500.0 ms"), (1.0, "1.00 s"), (12.345, "12.35 s"),
                                    (None, "-"), (math.nan, "-")])
def test_duration_picks_the_unit(v, want):
    assert duration(v) == want


def test_page_escapes_title_and_verdict_and_inlines_plotly():
    doc = page("a <b> & c", "x < y", "<p>body</p>")
    assert doc.startswith("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>a &lt;b&gt; &amp; c</title>")
    assert "<h1>a &lt;b&gt; &amp; c</h1>\n<p class=\"verdict\">x &lt; y</p>\n<p>body</p>\n</body></html>" in doc
    assert "<script src=" not in doc and len(doc) > 3_000_000   # plotly.js inlined: works offline
