"""Remap windows chosen by the planner (not set by hand) executed on 8 gloo ranks (2x4 and 4x2): exact
against float64 per-sequence SDPA and bitwise the same as without the windows
(:mod:`planned_window_workers`)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import planned_window_workers
from dist_harness import spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def test_planner_chosen_windows_world_8() -> None:
    for spec, seed in planned_window_workers.CASES:  # the planner chooses them (checked here, before spawning)
        plan = planned_window_workers.slow_links_plan(spec, seed)
        assert plan.remap_slots and plan.world_size == 8
    directions = {x.direction for s, k in planned_window_workers.CASES
                  for x in planned_window_workers.slow_links_plan(s, k).remap_slots}
    assert directions == {"to_attention", "to_linear"}
    spawn(8, planned_window_workers.run_planned_windows)
