"""The garbage collector of a long-lived agent process.

Everything built before the agent is ready (the imported modules, the configuration, the
agent's wiring: some 55,000 tracked objects) lives until the process ends. Left in the
collector's oldest generation, every full collection walks all of them: 10-14 ms of one core on
a desktop machine, ten times that on a Pi Zero, taken in the middle of whatever sale is running.
``gc.freeze()`` once start-up is over moves them to the permanent generation, which no collection
scans; what sales allocate afterwards is collected as before.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_start_up_objects() -> bool:
    """Freeze what exists now, once a process (a second agent in the same process, as in the
    tests, must not freeze the first one's garbage). True when this call froze."""
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()  # the start-up garbage goes now, not into the permanent generation
    gc.freeze()
    return True
