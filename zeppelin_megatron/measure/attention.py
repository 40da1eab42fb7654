"""Attention kernel work on one device: a list of varlen calls, run forward then backward.

A :class:`KernelCall` is one call of an attention backend
(:mod:`zeppelin_megatron.runtime.kernels`) on a :class:`VarlenBatch`;
calls are grouped into *queues* (a ring, or a rank's local sequences). The
engine runs every queue's forward calls in order, then every queue's backward
calls in the same order; :class:`AttentionWork` does the same on random inputs,
so timing :meth:`AttentionWork.run` times exactly those kernel calls.

Buffers. Inputs live in flat buffers big enough for the largest call; call
``c`` with ``T_q`` query rows, ``T_k`` key rows and ``Hq``/``Hkv`` heads reads
views ``q [T_q, Hq, D]``, ``k``, ``v`` [T_k, Hkv, D] of them. Backward needs an
output and a log-sum-exp for its queries: each queue keeps the forward result
of its largest call (a ring's diagonal step covers all of the rank's ring
rows) and every backward call of the queue reads its first ``T_q`` rows, as
the engine reads the ring's final (merged) output. The kernel does the same
work whatever the values; the log-sum-exp merges and row gathers between
calls are not replayed (kernel calls only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..runtime.kernels import AttentionKernel, VarlenBatch

__all__ = ["KernelCall", "AttentionWork", "causal_pairs", "call_pairs"]

KINDS = ("ring_diag", "ring_early", "ring_late", "local", "allgather", "ulysses", "profile")


@dataclass(frozen=True, kw_only=True)
class KernelCall:
    """One varlen kernel call. ``queue``: index of its queue on the rank; ``step``: ring step (0 otherwise)."""

    queue: int
    kind: str
    step: int
    batch: VarlenBatch
    q_heads: int
    kv_heads: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kernel call kind {self.kind!r} is not one of {KINDS}")
        if self.q_heads < 1 or self.kv_heads < 1 or self.q_heads % self.kv_heads:
            raise ValueError(
                f"q_heads = {self.q_heads} must be a positive multiple of kv_heads = {self.kv_heads}")

    @property
    def q_tokens(self) -> int:
        return self.batch.total_q

    @property
    def k_tokens(self) -> int:
        return self.batch.total_k


def causal_pairs(n: int) -> int:
    """(query, key) pairs a causal segment of ``n`` tokens computes: ``n (n + 1) / 2``."""
    return n * (n + 1) // 2


def call_pairs(batch: VarlenBatch) -> int:
    """(query, key) pairs of one call (bottom-right causal masks; ``Lq <= Lk`` for causal segments).

    Causal segment ``Lq x Lk``: query ``a`` sees ``a + Lk - Lq + 1`` keys, so
    ``Lq (Lk - Lq) + Lq (Lq + 1) / 2`` pairs; e.g. ``3 x 5``: ``3 + 4 + 5 = 12``.
    """
    total = 0
    for lq, lk in zip(batch.lens_q, batch.lens_k):
        if not batch.causal:
            total += lq * lk
        else:
            if lq > lk:
                raise ValueError(f"causal segment with {lq} queries but only {lk} keys")
            total += lq * (lk - lq) + causal_pairs(lq)
    return total


class AttentionWork:
    """Random inputs for ``calls`` and one forward + backward pass over them (see the module docstring)."""

    def __init__(
        self,
        calls: Sequence[KernelCall],
        *,
        head_dim: int,
        kernel: AttentionKernel,
        dtype: torch.dtype,
        device: torch.device,
        scale: float | None = None,
        seed: int = 0,
    ) -> None:
        if head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {head_dim}")
        self.calls = tuple(calls)
        self.kernel = kernel
        self.head_dim = head_dim
        self.scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        d = head_dim
        q_numel = max((c.q_tokens * c.q_heads * d for c in self.calls), default=0)
        k_numel = max((c.k_tokens * c.kv_heads * d for c in self.calls), default=0)
        gen = torch.Generator(device=device).manual_seed(seed)
        rnd = lambda n: torch.randn(n, generator=gen, device=device, dtype=dtype)  # noqa: E731
        self._q, self._dout = rnd(q_numel), rnd(q_numel)
        self._k, self._v = rnd(k_numel), rnd(k_numel)
        # queue -> index of its call with the most query elements (ties: the earliest)
        self._keeper: dict[int, int] = {}
        for i, c in enumerate(self.calls):
            best = self._keeper.get(c.queue)
            if best is None or c.q_tokens * c.q_heads > self.calls[best].q_tokens * self.calls[best].q_heads:
                self._keeper[c.queue] = i

    def _views(self, c: KernelCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        d = self.head_dim
        nq, nk = c.q_tokens * c.q_heads * d, c.k_tokens * c.kv_heads * d
        return (self._q[:nq].view(c.q_tokens, c.q_heads, d), self._k[:nk].view(c.k_tokens, c.kv_heads, d),
                self._v[:nk].view(c.k_tokens, c.kv_heads, d), self._dout[:nq].view(c.q_tokens, c.q_heads, d))

    def forward(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Every call's forward in order; -> queue -> (out, lse) of its keeper call."""
        kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, c in enumerate(self.calls):
            q, k, v, _ = self._views(c)
            out, lse = self.kernel.forward(q, k, v, c.batch, self.scale)
            if self._keeper[c.queue] == i:
                kept[c.queue] = (out, lse)
        return kept

    def backward(self, kept: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Every call's backward in the same order, with its queue's kept output rows."""
        for c in self.calls:
            q, k, v, dout = self._views(c)
            out, lse = kept[c.queue]
            self.kernel.backward(dout, q, k, v, out[:c.q_tokens], lse[:c.q_tokens], c.batch, self.scale)

    def run(self) -> None:
        """One forward + backward over all calls (what a layer's attention costs this rank)."""
        if self.calls:
            self.backward(self.forward())
