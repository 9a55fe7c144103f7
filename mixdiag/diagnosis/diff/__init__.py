"""``mixdiag diff``'s compute: two captures side by side (docs/diff.md).

:mod:`.capture` reads one side's facts off its Timeline and Diagnosis (ITL, TTFT, the excess budget and
regime decomposition by cause, episodes, spikes) with :mod:`.noise` (a time-block bootstrap);
:mod:`.compare` sets the sides against each other (what moved beyond noise, which cause moved it,
whether the captures are comparable); :mod:`.kernels` compares step-class kernel times (the kernel
breakdown's frames); :mod:`.prediction` checks a ``mixdiag tune`` recommendation against AFTER.
Rendering lives in ``mixdiag/report_diff.py``. Imports: the diagnosis and base rooms only.
"""
from mixdiag.diagnosis.diff.capture import CaptureFacts, capture_facts
from mixdiag.diagnosis.diff.compare import Diff, diff
from mixdiag.diagnosis.diff.kernels import kernel_diff, kernels_of
from mixdiag.diagnosis.diff.prediction import PredictionCheck, check_prediction

__all__ = ["CaptureFacts", "Diff", "PredictionCheck", "capture_facts", "check_prediction", "diff", "kernel_diff",
           "kernels_of"]
