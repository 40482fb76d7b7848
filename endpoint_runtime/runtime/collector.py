"""Python's cyclic garbage collector in a receiver process, set for messages flowing.

Two settings, made once a receiver has loaded everything it keeps (Ray, asyncpg, the handler
modules, its pipeline):

- ``gc.freeze()``: what exists then lives as long as the process, so the collector's full
  collections leave it alone instead of walking it again and again;
- a young-generation threshold of :data:`YOUNG_THRESHOLD` allocations (Python's default is
  700). Each message allocates a few dozen tracked objects (its contexts, coroutines, hooks,
  headers) that live until its batch commits; with the default a young collection ran every
  ~30 messages of a batch, walked the batch's live objects and promoted them, and the
  collector took about a fifth of a batched receiver's instructions (docs/performance.md,
  "Instructions per message"). Garbage in reference cycles waits a little longer for its
  collection; nothing else changes.

A process whose threshold is already higher (set by the user's code) keeps it.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Allocations (less deallocations) of tracked objects between two young collections."""


def tune_receiver_process() -> tuple[int, int, int]:
    """Freeze what exists and raise the young threshold; returns the thresholds now set."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young != 0 and young < YOUNG_THRESHOLD:  # 0: the collector is off; leave it so
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return gc.get_threshold()
