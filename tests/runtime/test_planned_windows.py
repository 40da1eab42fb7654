"""Remap windows chosen by the planner (not set by hand) executed on 8 gloo ranks (2x4 and 4x2) and 6 (2x3 and
3x2): exact
against float64 per-sequence SDPA and bitwise the same as without the windows
(:mod:`planned_window_workers`)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import planned_window_workers
from dist_harness import spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


@pytest.mark.parametrize("world", [6, 8])
def test_planner_chosen_windows(world: int) -> None:
    cases = planned_window_workers.CASES[world]
    for spec, seed in cases:  # the planner chooses them (checked here, before spawning)
        plan = planned_window_workers.slow_links_plan(spec, seed)
        assert plan.remap_slots and plan.world_size == world
    directions = {x.direction for s, k in cases for x in planned_window_workers.slow_links_plan(s, k).remap_slots}
    assert directions == {"to_attention", "to_linear"}
    spawn(world, planned_window_workers.run_planned_windows)
