"""mixdiag/diagnosis/detection/chunk_step.py: a step slowed by its prompt chunk reaches chunk_min tokens in all
(the roofline ridge) with the chunk at least half of it - read from the lower edge of vLLM's iteration-token
bucket, which bounds the prompt part from below by floor - batch."""
import numpy as np
import pytest

from mixdiag.diagnosis.detection.chunk_step import large_chunk, large_chunk_one

MIN = 256.0


@pytest.mark.parametrize("case, prompt, batch, want", [
    ("a 449-token chunk beside 8 decodes, read from the 256 bucket edge as >= 248 prompt tokens", 248.0, 8.0, True),
    ("a step of the 256 bucket beside 16 decodes (chunk_min / 16)", 240.0, 16.0, True),
    ("the same bound beside no decodes: the step may hold 248 tokens in all", 248.0, 0.0, False),
    ("a chunk of chunk_min tokens, no batch known", 256.0, np.nan, True),
    ("a 256-bucket step beside 80 decodes: >= 176 prompt tokens, at the ridge (e2 eager stretches)", 176.0, 80.0, False),
    ("a step of 256+ tokens, mostly decodes", 100.0, 156.0, False),
    ("a 300-token chunk beside 300 decodes: the chunk alone passes the ridge", 300.0, 300.0, True),
    ("a short prompt beside a small batch", 64.0, 8.0, False),
    ("no reading", np.nan, 8.0, False),
])
def test_large_chunk(case, prompt, batch, want):
    assert bool(large_chunk([prompt], [batch], MIN)[0]) is want, case
    assert large_chunk_one(None if np.isnan(prompt) else prompt, None if np.isnan(batch) else batch, MIN) is want, case
