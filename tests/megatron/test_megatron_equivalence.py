"""Zeppelin inside megatron-core on CPU: same loss and gradients as one process running the global batch.

World 4 (TP = 1): 4 Zeppelin ranks as 2 nodes x 2. World 8 (TP = 2): two
Zeppelin groups of 2 x 2, one per TP rank; once more with every rank's rows padded
to a multiple of 3 (the padding sequence parallelism needs; real sequence
parallelism needs TE or apex norms, not available on CPU), and at world 4 to a
multiple of 16 (the padding FP8 GEMMs need; FP8 itself needs Transformer Engine on a GPU).
Plans come from the real planner and hold local, intra-node and inter-node
sequences; float32, relative 1e-5 (loss and every parameter's gradient). World 4 again under
Megatron's activation recomputation (full uniform, full block, selective).
"""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")

from dist_harness import spawn  # noqa: E402

import megatron_workers  # noqa: E402


def test_tp1_world4_matches_single_process() -> None:
    """Once more with every rank's rows padded to a multiple of 16 (FP8 GEMMs' alignment)."""
    spawn(4, megatron_workers.check_equivalence, 1, (1, 16))


def test_tp2_world8_matches_single_process() -> None:
    spawn(8, megatron_workers.check_equivalence, 2, (1, 3))


def test_activation_recomputation_matches_single_process() -> None:
    """--recompute-granularity full (uniform and block) and selective: Zeppelin's attention and the layer hooks run
    again in the backward pass, on every rank alike; the same loss and gradients."""
    spawn(4, megatron_workers.check_recompute)
