"""Remap windows in the runtime (``runtime/overlap.py``) on gloo ranks: one spawn per world size runs
every check of :mod:`window_workers` (call order, exactness against float64 per-sequence SDPA, bitwise
the same results without the windows) on 1x2 and 2x1, 2x2 (and ``plan_step`` plans), 2x3 and 3x2, 2x4 and 4x2, direct
and routed remaps, MHA and GQA (more plans behind ``slow``); and a failed peer makes the posted remap's
wait time out."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import window_workers
from dist_harness import spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def test_windows_world_2() -> None:
    spawn(2, window_workers.run_windows, 2)


def test_windows_world_4() -> None:
    spawn(4, window_workers.run_windows, 2)


def test_windows_world_6() -> None:
    spawn(6, window_workers.run_windows, 1)  # 2x3 and 3x2


def test_windows_world_8() -> None:
    spawn(8, window_workers.run_windows, 1)


@pytest.mark.slow
def test_windows_more_plans() -> None:
    spawn(4, window_workers.run_windows, 4, 1000)
    spawn(8, window_workers.run_windows, 3, 1000)


def test_window_remap_times_out_world_2() -> None:
    spawn(2, window_workers.run_window_timeouts, 3.0)
