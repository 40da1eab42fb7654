"""Device-memory charges: the elementwise passes and row copies an attention runtime does besides its kernels.

The byte formulas live in :mod:`zeppelin_megatron.planner.engine_costs` (Zeppelin's engine; one derivation:
the planner prices the same work when it scores and predicts plans; its docstring counts every charge from the
runtime's code) and :mod:`zeppelin_megatron.planner.peer_costs` (the baselines' engines, read from their code)
and are re-exported here; this module adds the simulator's charge models. Every charge is
``bytes / hbm_GBps`` (:func:`hbm_ms`); ``sim/program.py`` turns them into ``copy`` ops.
"""

from __future__ import annotations

from ..planner.engine_costs import (
    A2A_PARTS, Shape, a2a_token_bytes, call_bytes, hbm_ms, merge_bytes, remap_gathers, shape_of, ulysses_call_bytes,
    wire_factor, zeppelin_a2a_bytes, zeppelin_call_bytes, zeppelin_local_bytes, zeppelin_remap_bytes,
    zeppelin_ring_bytes,
)
from ..planner.peer_costs import (
    PEER_A2A_PASSES, TE_STEP_KINDS, peer_a2a_bytes, peer_a2a_permutes, te_a2a_bytes, te_ring_bytes, te_step_bytes,
)

__all__ = ["hbm_ms", "Shape", "shape_of", "merge_bytes", "call_bytes", "zeppelin_call_bytes", "wire_factor",
           "zeppelin_ring_bytes", "zeppelin_local_bytes", "zeppelin_remap_bytes", "remap_gathers", "te_step_bytes",
           "CHARGES", "charges_for", "a2a_token_bytes", "ulysses_call_bytes", "zeppelin_a2a_bytes", "A2A_PARTS",
           "PEER_A2A_PASSES", "peer_a2a_bytes", "peer_a2a_permutes", "te_a2a_bytes", "te_ring_bytes", "TE_STEP_KINDS"]

CHARGES: tuple[str, ...] = ("zeppelin", "te", "none")
"""Charge models: ``zeppelin`` (this project's engine, counted from its code), ``te`` (TE CP's ring) and
``none`` (no device-memory charges, dK/dV in the training dtype, ring calls timed as the largest
area-averaged off-diagonal block: the simulator before these charges, for tests of its timing
mechanics and before/after comparisons)."""


def charges_for(strategy: str) -> str:
    """The charge model of a strategy: ``zeppelin`` for Zeppelin and its ablations (they run this
    project's engine), ``te`` for every other (ring baselines run TE CP; the others have no ring)."""
    return "zeppelin" if strategy.startswith("zeppelin") else "te"
