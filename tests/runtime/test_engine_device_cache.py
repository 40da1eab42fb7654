"""The engine's device-side indices and ring caches are built once per plan, not once per layer."""

from __future__ import annotations

import torch

from plan_factory import random_plan
from test_ring_router_units import FakeGroup
from zeppelin_megatron.runtime.engine import _device_indices, build_program
from zeppelin_megatron.runtime.ring import RingLayout, ring_cache
from zeppelin_megatron.runtime.router import Router


class _R(Router):
    def __init__(self, plan):  # type: ignore[no-untyped-def]
        self.group = FakeGroup(size=plan.world_size, gpus_per_node=plan.gpus_per_node)
        self._routes = {(r.ring, r.src, r.dst): r for r in plan.routing}


def test_device_indices_are_built_once_per_plan_and_match_the_program() -> None:
    cpu = torch.device("cpu")
    plan = random_plan(11, 2, 4)
    for rank in range(plan.world_size):
        prog = build_program(plan, rank, _R(plan))
        key = (rank, plan.gpus_per_node, True, cpu)
        rows, local = _device_indices(plan, prog, key)
        again = _device_indices(plan, prog, key)
        assert again[0] is rows and again[1] is local  # no rebuild for a second layer
        assert [r.tolist() for r in rows] == [list(t.rows) for t in prog.rings]
        assert [(r.tolist(), b.lens_q, b.lens_k, b.causal) for r, b in local] == [
            (list(c.rows), c.lens, c.lens, True) for c in prog.local_chunks]


def test_ring_cache_is_shared_per_layout_position_and_device() -> None:
    cpu = torch.device("cpu")
    lay = RingLayout(ranks=(0, 1, 2), lengths=(12, 7))
    a = ring_cache(lay, 1, cpu)
    assert ring_cache(lay, 1, cpu) is a
    assert ring_cache(lay, 2, cpu) is not a
    assert a.layout is lay and a.position == 1 and a.device == cpu
