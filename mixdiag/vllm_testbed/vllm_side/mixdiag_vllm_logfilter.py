"""A logging filter that runs inside the vLLM server (not in mixdiag): it sends vLLM's per-iteration
records (``--enable-logging-iteration-details``) to the truth handler and keeps them out of the
operator log. The testbed puts this folder (this module and the GC-pause hook) on the server's
``PYTHONPATH`` and names the class in the ``VLLM_LOGGING_CONFIG_PATH`` file; standard library only.
"""
import logging

# vLLM 0.32 logs "%sIteration(%d): %d context requests, ..." from vllm.v1.metrics.loggers; the
# periodic stats line comes from the same logger, so the split is by message, not by logger name.
MARK = "Iteration("


class IterationRecords(logging.Filter):
    """``keep=True``: pass only iteration records; ``keep=False``: pass everything else."""

    def __init__(self, keep: bool = True):
        super().__init__()
        self.keep = bool(keep)

    def filter(self, record: logging.LogRecord) -> bool:
        is_iteration = record.name.startswith("vllm.v1.metrics") and MARK in str(record.msg)
        return is_iteration == self.keep
