"""``gc_paused``: run an allocation-heavy planning stage without the cyclic garbage collector.

A batch of a million sequences allocates millions of small objects; CPython's
collector then runs a generation-0 pass every 700 allocations and, as the
older generations fill, full passes over everything alive: about a quarter of
the planning time of 1M length-1 sequences. Nothing the planner builds is
cyclic garbage, so the stages that build per-sequence objects (partition,
validation, the linear layout, the JSON writer) pause the collector and restore
its previous state on exit (nested pauses keep it off until the outermost ends).

The collector's switch is process-wide: while a planning thread (e.g. the data
loader's prefetch thread planning the next step) is inside a pause, other
threads run without cyclic collection too, which only defers it; overlapping
pauses in two threads leave it enabled at the end if it was enabled before the
first. Code that turns the collector off itself while a pause is active gets it
back on when that pause ends.

Example::

    with gc_paused():
        assignments = [Assignment("local", (r,)) for r in ranks]
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; re-enable it after only if it was enabled."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
