"""Multi-rank tests on CPU with gloo: one spawn per world size runs every check.

Each spawn loops over topologies (world 2: 1x2 and 2x1 plus groups of one;
world 4: 2x2 plus a permuted rank map and sub-groups; world 6: 2x3 and 3x2; world 8: 2x4 and 4x2) and
random long-tailed plans with local, intra-node and inter-node sequences,
checking: remap round trip (values and gradients), router delivery (random
messages and every ring step of the plans, routed and direct), attention output
and dq/dk/dv against per-sequence causal SDPA (float64 to 1e-9, float32 to
1e-5; routing on/off; with and without GQA), plan-mismatch detection and input
errors. Then head-parallel rings (``heads_workers.run_heads``) in the same spawns, and world 6
(2x3; 3x2 too in the slow sweep) in its own: random plans mixing head-parallel rings (Ulysses and hybrid) with plain
rings and local sequences, trace and exactness as above for MHA and GQA heads (K/V heads
replicated over lanes too), heads that cannot split rejected before any work.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from dist_harness import spawn
import heads_workers
import runtime_workers

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def test_world_2() -> None:
    spawn(2, runtime_workers.run_all, 3, True, 0, 2)


def test_world_4() -> None:
    spawn(4, runtime_workers.run_all, 3, True, 0, 2)


def test_world_6() -> None:
    spawn(6, runtime_workers.run_all, 1, True, 0, 0)  # 2x3 and 3x2: remap, router, traces, exactness


def test_heads_world_6() -> None:
    spawn(6, heads_workers.run_heads, 1, False, 0, 1)  # 2x3 (width 3); 3x2 in the slow sweep


def test_world_8() -> None:
    spawn(8, runtime_workers.run_all, 1, True, 0, 1)


@pytest.mark.slow
def test_world_8_more_plans() -> None:
    spawn(8, runtime_workers.run_all, 3, True, 1000, 3, True)


@pytest.mark.slow
def test_world_4_more_plans() -> None:
    spawn(4, runtime_workers.run_all, 6, True, 1000, 6, True)


@pytest.mark.slow
def test_heads_world_6_and_2_more_plans() -> None:
    spawn(6, heads_workers.run_heads, 6, True, 1000)
    spawn(2, heads_workers.run_heads, 6, True, 1000)
