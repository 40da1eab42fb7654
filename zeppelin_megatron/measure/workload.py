"""Each rank's planned attention kernel calls, as the runtime engine makes them.

For ``attention_comm == "ring"`` (Zeppelin, TE CP) the calls are the lowered
program's (:func:`~zeppelin_megatron.planner.lowering.lower_rank`, what the
runtime engine executes): the rank's :class:`~zeppelin_megatron.planner.lowering.RingCall` s
and :class:`~zeppelin_megatron.planner.lowering.LocalCall` s of the forward
op list, in order: each ring's step ``j`` call (its ``lens_q``, ``lens_k``,
mask), the local chunk the plan's ``local_slots`` put after it, and the local
sequences in no slot after the rings. Relays compute nothing, and routes do
not change calls, so the program is lowered without routing.

Worked example: a ring over ranks (4, 1) holding one sequence of 8 tokens
(chunks of 2). Rank 1 is position 1 and holds chunks 1, 2 (tokens [2, 6)):
step 0 is ``ring_diag`` (causal, q = k = 4 tokens); step 1 has src = 0 < 1,
``ring_early`` (q = 4 tokens against src's early chunk, 2 keys, full mask).
Rank 4 (position 0, tokens [0, 2) + [6, 8)): step 0 ``ring_diag`` (4 x 4
causal), step 1 src = 1 > 0, ``ring_late`` (q = its late chunk, 2 tokens,
against src's 4 keys).

Plans of other strategies (:mod:`zeppelin_megatron.sim.strategies`) keep the
zigzag attention layout but communicate differently inside a group of ranks
sharing sequences; their kernel calls, one per group:

* ``allgather`` (K/V all-gathered over the group, as TE's all-gather CP): the
  rank's early and late chunk of every sequence attend all keys up to their
  own end, causal (bottom-right). Above, rank 4: segments q = [0, 2) vs k =
  [0, 2) and q = [6, 8) vs k = [0, 8).
* ``ulysses`` (all-to-all from token-split to head-split): every rank of a
  group of ``g`` computes every sequence of the group whole, causal, with
  ``Hq / g`` query heads and ``Hkv / g`` K/V heads (one replicated K/V head
  when ``Hkv < g``); ``Hq`` must divide by ``g``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..planner.lowering import LocalCall, RingCall, RingPart, lower_rank
from ..planner.plan import StepPlan
from ..planner.zigzag import zigzag_ranges
from ..runtime.kernels import VarlenBatch
from .attention import KernelCall

__all__ = ["RankWork", "rank_work", "ATTENTION_COMMS"]

ATTENTION_COMMS: tuple[str, ...] = ("ring", "allgather", "ulysses")


@dataclass(frozen=True, kw_only=True)
class RankWork:
    """One rank's kernel calls (engine order) and its linear-layout token count."""

    rank: int
    calls: tuple[KernelCall, ...]
    attention_tokens: int
    linear_tokens: int


def rank_work(
    plan: StepPlan, rank: int, *, q_heads: int, kv_heads: int, device: torch.device, attention_comm: str = "ring",
) -> RankWork:
    """The kernel calls rank ``rank`` makes for one layer's attention under ``plan``."""
    if attention_comm not in ATTENTION_COMMS:
        raise ValueError(
            f"replay of attention_comm={attention_comm!r} is not supported (supported: {list(ATTENTION_COMMS)})")
    if not 0 <= rank < plan.world_size:
        raise ValueError(f"rank {rank} is outside the plan's [0, {plan.world_size})")
    program = lower_rank(plan, rank, routing=False)
    members = [p for p in program.rings if p.position is not None]
    queue_of = {p.ring: q for q, p in enumerate(members)}
    local_queue = len(members)
    calls: list[KernelCall] = []
    if attention_comm == "ring":
        for op in program.forward:
            if isinstance(op, RingCall):
                batch = VarlenBatch(lens_q=op.lens_q, lens_k=op.lens_k, causal=op.causal, device=device)
                calls.append(KernelCall(queue=queue_of[op.ring], kind=f"ring_{op.kind}", step=op.step, batch=batch,
                                        q_heads=q_heads, kv_heads=kv_heads))
            elif isinstance(op, LocalCall):  # local chunk c: queue ``local_queue``, step c
                lens = program.local_chunks[op.chunk].lens
                calls.append(KernelCall(queue=local_queue, kind="local", step=op.chunk, batch=VarlenBatch(
                    lens_q=lens, lens_k=lens, causal=True, device=device), q_heads=q_heads, kv_heads=kv_heads))
    else:
        for queue, part in enumerate(members):
            if attention_comm == "allgather":
                calls.append(_allgather_call(part, queue, q_heads, kv_heads, device))
            else:
                calls.append(_ulysses_call(part, queue, q_heads, kv_heads, device))
        if program.local_lens:  # other strategies: the local sequences as one call after the groups
            batch = VarlenBatch(lens_q=program.local_lens, lens_k=program.local_lens, causal=True, device=device)
            calls.append(KernelCall(queue=local_queue, kind="local", step=0, batch=batch, q_heads=q_heads,
                                    kv_heads=kv_heads))
    return RankWork(rank=rank, calls=tuple(calls), attention_tokens=program.tokens,
                    linear_tokens=plan.tokens(rank, "linear"))


def _allgather_call(part: RingPart, queue: int, q_heads: int, kv_heads: int, device: torch.device) -> KernelCall:
    """Each held chunk attends keys ``[0, chunk end)`` of the gathered sequence (bottom-right causal)."""
    lens_q: list[int] = []
    lens_k: list[int] = []
    assert part.position is not None
    for n in part.lengths:
        for start, end in zigzag_ranges(n, part.size, part.position):
            lens_q.append(end - start)
            lens_k.append(end)
    batch = VarlenBatch(lens_q=tuple(lens_q), lens_k=tuple(lens_k), causal=True, device=device)
    return KernelCall(queue=queue, kind="allgather", step=0, batch=batch, q_heads=q_heads, kv_heads=kv_heads)


def _ulysses_call(part: RingPart, queue: int, q_heads: int, kv_heads: int, device: torch.device) -> KernelCall:
    """Whole sequences of the group with ``1/g`` of the query heads.

    K/V heads: ``Hkv / g`` when ``g`` divides them; with fewer K/V heads than
    ranks (``g % Hkv == 0``) each rank's query heads fall in one K/V group and
    that one K/V head is replicated (e.g. Hq = 8, Hkv = 2, g = 4: 2 query heads
    and 1 K/V head per rank).
    """
    g = part.size
    if q_heads % g:
        raise ValueError(f"ulysses over a group of {g} ranks needs q_heads ({q_heads}) divisible by {g}")
    if kv_heads % g == 0:
        kv_local = kv_heads // g
    elif g % kv_heads == 0:
        kv_local = 1
    else:
        raise ValueError(f"ulysses over a group of {g} ranks needs kv_heads ({kv_heads}) to divide or be a "
                         f"multiple of {g}")
    batch = VarlenBatch(lens_q=part.lengths, lens_k=part.lengths, causal=True, device=device)
    return KernelCall(queue=queue, kind="ulysses", step=0, batch=batch, q_heads=q_heads // g, kv_heads=kv_local)
