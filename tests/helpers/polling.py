"""Waiting on a live server's state without a fixed sleep: poll a predicate until it holds."""
import time


def wait_until(pred, timeout: float = 20.0, every: float = 0.05) -> bool:
    """True once ``pred()`` holds, False if it never did within ``timeout`` seconds (a hang guard, not a
    timing assertion)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(every)
    return False
