"""Staying rows skip the remap's exchange and in-place local chunks run on the linear rows (issue 12 item 4),
on gloo ranks (:mod:`inplace_workers`): remap round trip, exactness against float64 SDPA (MHA, GQA), bitwise
the plain path, no collective for identical layouts; 1x2, 2x1, 2x2, 2x3, 3x2, 2x4, 4x2, direct and routed."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import inplace_workers
from dist_harness import spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def test_in_place_world_2() -> None:
    spawn(2, inplace_workers.run_in_place, 2)


def test_in_place_world_4() -> None:
    spawn(4, inplace_workers.run_in_place, 1)


def test_in_place_world_8() -> None:
    spawn(8, inplace_workers.run_in_place, 1)


def test_in_place_world_6() -> None:
    spawn(6, inplace_workers.run_in_place, 1)  # 2x3 and 3x2
