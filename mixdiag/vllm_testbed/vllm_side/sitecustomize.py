"""Imported by every Python process of the testbed's ``vllm serve`` (this folder is its PYTHONPATH).

Where ``MIXDIAG_GC_PAUSE_DIR`` is set, SIGUSR1 makes the process run full garbage collections of its
whole heap - the GC pause a Python engine suffers when its heap is not frozen (vLLM freezes it after
start-up, ``gc_utils.freeze_gc_heap``, precisely to avoid this). The testbed signals only the EngineCore.

Protocol (mixdiag/vllm_testbed/injectors.py): the testbed writes the seconds to pause to
``$MIXDIAG_GC_PAUSE_DIR/request`` and sends SIGUSR1; the handler collects until that long has passed (at
least once) and appends ``<pid> <start unix s> <end unix s> <collections>`` to ``.../done.log`` - the truth
row. vLLM's own GC debugger (``VLLM_GC_DEBUG=1``) logs each collection's time in the operator log: the
evidence. Nothing here writes to the operator log.
"""
import os

_DIR = os.environ.get("MIXDIAG_GC_PAUSE_DIR")

if _DIR:
    import gc
    import signal
    import time

    def _pause(signum, frame):
        try:
            with open(os.path.join(_DIR, "request")) as f:
                want = float(f.read().strip() or 0)
        except (OSError, ValueError):
            want = 0.0
        t0, n = time.time(), 0
        while n == 0 or time.time() - t0 < want:
            # the frozen heap (vLLM's start-up objects) back into the oldest generation, one full
            # collection over all of it, frozen again: the pause vLLM's freeze normally saves
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            n += 1
        t1 = time.time()
        with open(os.path.join(_DIR, "done.log"), "a") as f:
            f.write(f"{os.getpid()} {t0:.6f} {t1:.6f} {n}\n")

    try:
        signal.signal(signal.SIGUSR1, _pause)
    except ValueError:   # not the main thread of the interpreter: nothing to install
        pass
