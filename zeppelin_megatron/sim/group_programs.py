"""The non-ring baselines' attention groups in a simulated layer: ``ulysses`` (FlexSP) and ``allgather`` (TE CP's
all-gather), one group at a time (:func:`group_ops`, called by :func:`~.program.build_layer_program`).

* ``ulysses``: each member holds ``t_r`` tokens of the group's sequences (zigzag chunks). The sender's copy
  before the all-to-all in (:data:`~.charges.PEER_A2A_PASSES` ``ulysses``: heads scattered, one pass over its
  ``t_r`` tokens), the all-to-all in (each member sends ``t_r (2 q + kv) / g`` bytes to each other member:
  forward q, k, v, backward output gradient), one call over the group's sequences with ``1/g`` of the heads
  (``sum causal_ms(s) / g``), the all-to-all out (the same bytes back: output forward, dq, dk, dv backward),
  the receiver's copy after it (heads gathered, one pass over the ``sum t / g`` tokens it received). The copies
  are charged unless ``charges == "none"``.
* ``allgather``: post the K/V all-gather (``2 t_r kv`` bytes from each member to each other: forward, and again
  in backward), compute the rank's own diagonal blocks meanwhile, wait, compute the rest of its rows
  (``block_ms(s/g, s) / 2`` in total per sequence), reduce-scatter dK/dV (``t_j kv`` bytes to each member
  ``j``). No copies charged.

Example (``ulysses``, Llama-7B bf16, one 65536-token sequence on 2 GPUs of a node): each holds 32768 tokens,
sends ``32768 * 32768 / 2 = 537 MB`` each way (2 q + kv = 32 KiB per token), and copies
``peer_a2a_bytes(sh, 32768) = 2.15 GB`` (0.73 ms) before the first all-to-all and as much after the second.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

from ..planner.cost_model import CostModel
from ..planner.plan import Ring, StepPlan
from ..planner.zigzag import zigzag_tokens
from .charges import hbm_ms, peer_a2a_permutes, shape_of
from .layer_ops import Op, Traffic, pairs_transfer

__all__ = ["group_ops", "tokens_by_rank"]


def tokens_by_rank(plan: StepPlan, seq: int) -> dict[int, int]:
    """Rank -> tokens of sequence ``seq`` it holds (zigzag chunks over the sequence's ranks)."""
    s = plan.sequences[seq]
    g = len(s.ranks)
    return {r: zigzag_tokens(s.length, g, p) for p, r in enumerate(s.ranks)}


def group_ops(plan: StepPlan, ring: Ring, cost: CostModel, attention_comm: str, ops: list[list[Op]],
              add: Callable[[Traffic], tuple], charges: str = "te") -> None:
    """Append one ``ulysses`` or ``allgather`` group's ops to ``ops`` (per rank) and register its transfers with
    ``add`` (module docstring); ``charges``: ``none`` drops the ``ulysses`` copies."""
    o = cost.call_overhead_ms
    per_token = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    kvb = cost.kv_bytes_per_token
    g = len(ring.ranks)
    lengths = [plan.sequences[i].length for i in ring.seqs]
    label = f"{ring.placement} group {list(ring.ranks)[:4]}{'...' if g > 4 else ''} ({len(lengths)} seqs)"
    held: dict[int, int] = defaultdict(int)
    for i in ring.seqs:
        for r, t in tokens_by_rank(plan, i).items():
            held[r] += t
    if attention_comm == "ulysses":
        a2a = {(a, b): held[a] * per_token / g for a in ring.ranks for b in ring.ranks if a != b}
        tin = add(pairs_transfer(("ulysses", ring.ranks, "in"), "group", cost, a2a))
        tout = add(pairs_transfer(("ulysses", ring.ranks, "out"), "group", cost,
                                  {(b, a): v for (a, b), v in a2a.items()}))
        comp = max(sum(cost.causal_ms(s) for s in lengths) / g, o)
        sh = shape_of(cost)
        got = sum(held[r] for r in ring.ranks) / g  # tokens' worth each member receives (all heads)
        for r in ring.ranks:
            ms = {k: hbm_ms(cost, x) if charges != "none" else 0.0
                  for k, x in peer_a2a_permutes(sh, "ulysses", held[r], got).items()}
            seq = [Op("compute", ms[("in", 0)], "copy", label=f"{label} all-to-all in: sender's permute"),
                   Op("post", key=tin), Op("wait", key=tin, kind="group", label=f"{label} all-to-all in"),
                   Op("compute", ms[("in", 1)], "copy", label=f"{label} all-to-all in: receiver's permute"),
                   Op("compute", comp, "attention", label=f"{label} ulysses"),
                   Op("compute", ms[("out", 0)], "copy", label=f"{label} all-to-all out: sender's permute"),
                   Op("post", key=tout), Op("wait", key=tout, kind="group", label=f"{label} all-to-all out"),
                   Op("compute", ms[("out", 1)], "copy", label=f"{label} all-to-all out: receiver's permute")]
            ops[r] += [op for op in seq if op.what != "compute" or op.ms > 0]
        return
    diag: dict[int, float] = defaultdict(float)
    rest: dict[int, float] = defaultdict(float)
    for i in ring.seqs:
        s = plan.sequences[i].length
        for r, t in tokens_by_rank(plan, i).items():
            d = cost.causal_ms(t)
            diag[r] += d
            rest[r] += max(cost.block_ms(t, s) / 2 - d, 0.0)
    ag = {(a, b): 2 * held[a] * kvb for a in ring.ranks for b in ring.ranks if a != b}
    rs = {(a, b): held[b] * kvb for a in ring.ranks for b in ring.ranks if a != b}
    tag = add(pairs_transfer(("allgather", ring.ranks, "ag"), "group", cost, ag))
    trs = add(pairs_transfer(("allgather", ring.ranks, "rs"), "group", cost, rs))
    for r in ring.ranks:
        ops[r] += [Op("post", key=tag),
                   Op("compute", max(diag[r], o), "attention", label=f"{label} own chunks"),
                   Op("wait", key=tag, kind="group", label=f"{label} all-gather K/V"),
                   Op("compute", max(rest[r], o), "attention", label=f"{label} gathered K/V"),
                   Op("post", key=trs), Op("wait", key=trs, kind="group", label=f"{label} reduce-scatter dK/dV")]
