"""Token-budget sampler: deterministic epochs cut into micro-steps of at most ``budget`` tokens.

Epoch ``e`` visits every sequence once, in the order
``np.random.default_rng([seed, e]).permutation(num_sequences)``. The order is
cut greedily: a micro-step takes the next sequences while their tokens fit in
``budget``; a sequence is never split across micro-steps. The last micro-step
of an epoch takes what is left (it may be smaller than the others); nothing is
carried into the next epoch, so each epoch is independent and micro-step ``k``
is a pure function of ``(lengths, budget, seed, k)``.

Worked example, ``lengths = [5, 3, 4, 2, 6]``, ``budget = 8``, an epoch order
``[4, 1, 0, 2, 3]`` (tokens ``6, 3, 5, 4, 2``): cumulative tokens
``[0, 6, 9, 14, 18, 20]``; micro-step 0 = ``(4,)`` (6 + 3 > 8), micro-step 1 =
``(1, 0)`` (3 + 5 = 8), micro-step 2 = ``(2, 3)`` (4 + 2 = 6, the epoch's rest).
Micro-step 3 is the first of epoch 1.

A blend (``parts`` and ``weights``: several datasets' sequences, ids concatenated) visits blend epoch ``e`` in
:func:`~.blend.blend_order`'s order instead, cut the same way.
"""

from __future__ import annotations

import bisect
import threading
from typing import Sequence

import numpy as np

from .blend import blend_order
from .indexed import DataError

__all__ = ["TokenBudgetSampler"]


class TokenBudgetSampler:
    """Micro-step ``k`` -> the sequence ids it trains on (pure in ``k``).

    Args:
        lengths: tokens of each sequence (each ``1 <= length <= budget``).
        budget: most tokens of one micro-step.
        seed: shuffling seed (same on every rank).
        parts: for a blend, the sequences of each dataset (``lengths`` concatenates theirs, in this order);
            ``None`` or one part: a single dataset.
        weights: for a blend, one positive weight per part (``None``: by the parts' tokens, as Megatron blends
            datasets given without weights).

    Epoch boundaries are computed lazily, once per epoch, and cached: asking
    for micro-step ``k`` computes the cut of every epoch up to ``k``'s.
    """

    def __init__(self, *, lengths: Sequence[int] | np.ndarray, budget: int, seed: int,
                 parts: Sequence[int] | None = None, weights: Sequence[float] | None = None) -> None:
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
            raise DataError(f"budget must be a positive integer, got {budget!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise DataError(f"seed must be a non-negative integer, got {seed!r}")
        arr = np.asarray(lengths)
        if arr.ndim != 1 or arr.size == 0:
            raise DataError(f"lengths must be a non-empty 1-D sequence, got shape {arr.shape}")
        if not np.issubdtype(arr.dtype, np.integer):
            raise DataError(f"lengths must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
        bad = np.flatnonzero(arr < 1)
        if bad.size:
            raise DataError(f"sequence {int(bad[0])} has length {int(arr[bad[0]])}; lengths must be >= 1")
        longest = int(arr.argmax())
        if arr[longest] > budget:
            raise DataError(
                f"sequence {longest} has {int(arr[longest])} tokens, more than the micro-step budget of "
                f"{int(budget)} tokens (a sequence is never split across micro-steps)"
            )
        self.parts = _parts(parts, weights, arr.size)
        self.weights = None if weights is None else tuple(float(w) for w in weights)
        self._lengths = arr
        self._lengths.setflags(write=False)
        self.budget = int(budget)
        self.seed = int(seed)
        self._bounds: list[np.ndarray] = []  # per epoch: positions in the order where micro-steps start, + end
        self._first_step: list[int] = [0]  # global index of each epoch's first micro-step (+ next epoch's)
        self._order_cache: tuple[int, np.ndarray] | None = None
        self._lock = threading.RLock()  # the iterator's prefetch thread and the caller share the caches

    @property
    def num_sequences(self) -> int:
        return int(self._lengths.size)

    @property
    def lengths(self) -> np.ndarray:
        return self._lengths

    # -- epochs ------------------------------------------------------------------
    def order(self, epoch: int) -> np.ndarray:
        """The sequence ids of ``epoch`` in visiting order (``int64``: ``[num_sequences]``, each once; a blend's
        epoch: as many as its window holds, :func:`~.blend.blend_order`)."""
        cache = self._order_cache
        if cache is not None and cache[0] == epoch:
            return cache[1]
        if len(self.parts) > 1:
            perm = blend_order(self._lengths, self.parts, self.weights, self.seed, int(epoch))
        else:
            perm = np.random.default_rng([self.seed, int(epoch)]).permutation(self.num_sequences).astype(np.int64)
        perm.setflags(write=False)
        self._order_cache = (int(epoch), perm)
        return perm

    def _cut(self, epoch: int) -> np.ndarray:
        """Start positions of the epoch's micro-steps in its order, plus the order's length.

        ``cum[p]`` is the tokens of the first ``p`` sequences of the order; a
        micro-step starting at ``p`` ends at the largest ``q`` with
        ``cum[q] - cum[p] <= budget`` (``q > p`` since every length <= budget).
        """
        order = self.order(epoch)
        cum = np.zeros(order.size + 1, dtype=np.int64)
        np.cumsum(self._lengths[order], out=cum[1:])
        starts = [0]
        p, n = 0, order.size
        while p < n:
            p = int(np.searchsorted(cum, cum[p] + self.budget, side="right")) - 1
            starts.append(p)
        return np.asarray(starts, dtype=np.int64)

    def _extend_to(self, step: int) -> None:
        while self._first_step[-1] <= step:
            bounds = self._cut(len(self._bounds))
            self._bounds.append(bounds)
            self._first_step.append(self._first_step[-1] + bounds.size - 1)

    def steps_per_epoch(self, epoch: int = 0) -> int:
        """Micro-steps of ``epoch`` (epochs differ slightly: each has its own order)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise DataError(f"epoch must be a non-negative integer, got {epoch!r}")
        with self._lock:
            while len(self._bounds) <= epoch:
                self._extend_to(self._first_step[-1])
            return int(self._bounds[epoch].size - 1)

    def epoch_of(self, step: int) -> tuple[int, int]:
        """``(epoch, index of the micro-step inside that epoch)`` for global micro-step ``step``."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataError(f"micro-step index must be a non-negative integer, got {step!r}")
        step = int(step)
        with self._lock:
            self._extend_to(step)
            epoch = bisect.bisect_right(self._first_step, step) - 1
            return epoch, step - self._first_step[epoch]

    def micro_step(self, step: int) -> tuple[int, ...]:
        """Sequence ids of global micro-step ``step``, in order (tokens sum to <= ``budget``)."""
        with self._lock:
            epoch, j = self.epoch_of(step)
            bounds = self._bounds[epoch]
            return tuple(int(i) for i in self.order(epoch)[bounds[j]:bounds[j + 1]])

    def __repr__(self) -> str:
        blend = f", parts={self.parts}, weights={self.weights}" if len(self.parts) > 1 else ""
        return (f"TokenBudgetSampler(num_sequences={self.num_sequences}, budget={self.budget}, "
                f"seed={self.seed}{blend})")


def _parts(parts: Sequence[int] | None, weights: Sequence[float] | None, n: int) -> tuple[int, ...]:
    """``parts`` checked against ``n`` sequences and ``weights`` (:class:`TokenBudgetSampler`)."""
    if parts is None:
        if weights is not None:
            raise DataError("weights need parts: the sequences of each blended dataset")
        return (n,)
    out = tuple(parts)
    if not out or any(isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1 for p in out):
        raise DataError(f"parts must be positive integers (the sequences of each dataset), got {parts!r}")
    if sum(out) != n:
        raise DataError(f"parts {out} sum to {sum(out)} sequences but lengths has {n}")
    if weights is not None:
        ws = list(weights)
        if len(ws) != len(out):
            raise DataError(f"{len(ws)} weights for {len(out)} parts")
        if not all(isinstance(w, (int, float, np.number)) and np.isfinite(w) and w > 0 for w in ws):
            raise DataError(f"weights must be positive finite numbers, got {ws!r}")
    return tuple(int(p) for p in out)
