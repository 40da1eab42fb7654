"""Lower bound on a step: total work divided by the GPU count, no exposed communication.

Per layer: every sequence's attention at its most efficient (whole, one
kernel: ``causal_ms(s)``; splitting only adds per-call overhead and smaller,
less efficient blocks), summed and spread evenly over the ``P`` GPUs, and the
linear modules on a perfectly balanced ``ceil(T / P)`` tokens per GPU; each
GPU pays at least one kernel call overhead. Communication is free::

    lower_bound = layers * (max(sum_s causal_ms(s) / P, call_overhead) + linear_ms(ceil(T / P)))

No plan can beat it under the same cost model (up to the interpolation of
kernel rates, which is not exactly convex).
"""

from __future__ import annotations

from typing import Sequence

from ..planner.cost_model import CostModel

__all__ = ["lower_bound_ms"]


def lower_bound_ms(lengths: Sequence[int], cost: CostModel) -> float:
    if not lengths:
        raise ValueError("lower_bound_ms needs at least one sequence")
    p = cost.cluster.world_size
    attn = sum(cost.causal_ms(int(s)) for s in lengths) / p
    tokens = -(-sum(int(s) for s in lengths) // p)
    return cost.model.layers * (max(attn, cost.call_overhead_ms) + cost.linear_ms(tokens))
