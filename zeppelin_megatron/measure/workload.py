"""Each rank's planned attention kernel calls, as the runtime engine makes them.

For ``attention_comm == "ring"`` (Zeppelin, TE CP) the calls are the lowered
program's (:func:`~zeppelin_megatron.planner.lowering.lower_rank`, what the
runtime engine executes): the rank's :class:`~zeppelin_megatron.planner.lowering.RingCall` s
and :class:`~zeppelin_megatron.planner.lowering.LocalCall` s of the forward
op list, in order: each ring's step ``j`` call (its ``lens_q``, ``lens_k``,
mask), the local chunk the plan's ``local_slots`` put after it, and the local
sequences in no slot after the rings; the rank's remap window calls
(:attr:`~zeppelin_megatron.planner.lowering.RankProgram.windows`, the plan's ``remap_slots``)
where the engine runs them: the ``to_attention`` window first (inside the remap in), the
``to_linear`` one last (inside the remap out), each one causal call over its chunk's
sequences like a local call. Relays compute nothing, and routes do
not change calls, so the program is lowered without routing.

Worked example: a ring over ranks (4, 1) holding one sequence of 8 tokens
(chunks of 2). Rank 1 is position 1 and holds chunks 1, 2 (tokens [2, 6)):
step 0 is ``ring_diag`` (causal, q = k = 4 tokens); step 1 has src = 0 < 1,
``ring_early`` (q = 4 tokens against src's early chunk, 2 keys, full mask).
Rank 4 (position 0, tokens [0, 2) + [6, 8)): step 0 ``ring_diag`` (4 x 4
causal), step 1 src = 1 > 0, ``ring_late`` (q = its late chunk, 2 tokens,
against src's 4 keys).

Head-parallel rings (``a2a = a > 1``, :mod:`zeppelin_megatron.planner.head_parallel`): a member's
calls are its lane's, at block granularity (``lens_q`` / ``lens_k`` of the head buffer: its block's
tokens), with ``Hq / a`` query heads and ``lane_kv_heads(Hkv, a)`` K/V heads (one replicated K/V head
when ``Hkv < a``); a ring of one block (Ulysses) is one ``ring_diag`` call over whole sequences. E.g.
length 16 over ranks (0, 1, 2, 3), ``a = 2``, ``Hq = 8``, ``Hkv = 2``: rank 1 (block 0, lane 1) calls
``ring_diag`` (q = k = [0, 4) + [12, 16), causal) and ``ring_late`` (q = [12, 16) against block 1's 8
keys), each with 4 query heads and 1 K/V head. Heads that do not split over ``a`` raise ``ValueError``.

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

from ..planner.head_parallel import head_split_error, lane_kv_heads
from ..planner.lowering import LocalCall, RingCall, RingPart, lower_rank
from ..planner.plan import StepPlan
from ..planner.zigzag import zigzag_ranges
from ..runtime.kernels import VarlenBatch
from .attention import KernelCall

__all__ = ["RankWork", "rank_work", "lane_heads_of", "ATTENTION_COMMS"]

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
        heads = {p.ring: lane_heads_of(p, q_heads, kv_heads) for p in members}

        def local(chunk: int) -> KernelCall:  # local chunk c: queue ``local_queue``, step c
            lens = program.local_chunks[chunk].lens
            return KernelCall(queue=local_queue, kind="local", step=chunk, batch=VarlenBatch(
                lens_q=lens, lens_k=lens, causal=True, device=device), q_heads=q_heads, kv_heads=kv_heads)

        calls += [local(w.chunk) for w in program.windows if w.direction == "to_attention"]
        for op in program.forward:
            if isinstance(op, RingCall):
                batch = VarlenBatch(lens_q=op.lens_q, lens_k=op.lens_k, causal=op.causal, device=device)
                hq, hkv = heads[op.ring]
                calls.append(KernelCall(queue=queue_of[op.ring], kind=f"ring_{op.kind}", step=op.step, batch=batch,
                                        q_heads=hq, kv_heads=hkv))
            elif isinstance(op, LocalCall):
                calls.append(local(op.chunk))
        calls += [local(w.chunk) for w in program.windows if w.direction == "to_linear"]
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


def lane_heads_of(part: RingPart, q_heads: int, kv_heads: int) -> tuple[int, int]:
    """(query, K/V) heads of a member's calls in ring ``part``: all of them for a plain ring, its lane's
    for a head-parallel one (``q_heads / a``, ``lane_kv_heads``); ``(32, 8)`` at ``a = 4`` -> ``(8, 2)``,
    ``(8, 2)`` at ``a = 4`` -> ``(2, 1)``."""
    a = part.a2a
    if a == 1:
        return q_heads, kv_heads
    why = head_split_error(q_heads, kv_heads, a)
    if why is not None:
        raise ValueError(f"ring {part.ring} (ranks {list(part.ranks)}) is head-parallel of width {a}, but "
                         f"{q_heads} query and {kv_heads} K/V heads cannot split over it: {why}")
    return q_heads // a, lane_kv_heads(kv_heads, a)


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
