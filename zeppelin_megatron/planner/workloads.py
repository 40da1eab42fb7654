"""Synthetic long-tailed batches (deterministic for a seed).

``long_tailed_batch`` draws documents until ``total_tokens`` is reached: with
probability ``long_fraction`` a long document uniform in ``[long_min,
long_max]``, else a short one, log-normal with median ``short_median`` and
log-sigma ``short_sigma``, clipped to ``[1, short_max]``. The last document is
cut so the batch holds exactly ``total_tokens``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["long_tailed_batch"]


def long_tailed_batch(
    total_tokens: int,
    seed: int,
    *,
    long_fraction: float = 0.03,
    long_min: int = 32768,
    long_max: int = 131072,
    short_median: int = 665,
    short_sigma: float = 1.0,
    short_max: int = 4096,
) -> list[int]:
    """Lengths summing to ``total_tokens``: mostly short documents, a few very long."""
    if total_tokens < 1:
        raise ValueError(f"total_tokens must be >= 1, got {total_tokens}")
    rng = np.random.default_rng(seed)
    out: list[int] = []
    left = total_tokens
    while left > 0:
        if rng.random() < long_fraction:
            s = int(rng.integers(long_min, long_max + 1))
        else:
            s = int(min(short_max, max(1.0, rng.lognormal(math.log(short_median), short_sigma))))
        s = min(s, left)
        out.append(s)
        left -= s
    return out
