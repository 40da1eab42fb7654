"""Transformer Engine CP, ``cp_comm_type = "a2a+p2p"``: Ulysses inside a node, a ring across.

Megatron ``--context-parallel-size cp --cp-comm-type a2a+p2p
--hierarchical-context-parallel-sizes a p``: CP groups of ``cp = a x p``
consecutive ranks; inside a group, ``a`` consecutive ranks (one node) form an
all-to-all (head-parallel) group, and the ``p`` ranks with the same index in the
``p`` all-to-all groups form a ring. Per CP group, per layer (forward + backward
merged, as the cost model times them):

1. all-to-all in over each ``a``-group: every rank sends ``held x (2 q + kv) / a``
   bytes to each other member (forward q, k, v; backward output gradient), as
   ``ulysses`` groups do, with TE's permute copies before and after it
   (:data:`~.charges.PEER_A2A_PASSES` ``te``: one pass on each side, ``copy`` ops);
2. ring attention over ``p`` positions with ``1/a`` of the heads: step 0 the diagonal,
   steps ``1 .. p-1`` the off-diagonal blocks of a ``p``-way zigzag split
   (``ring_compute_profile(s, p) / a`` summed over the group's sequences, one call per
   step, at least the per-call overhead), each step sending ``3 ring_step_bytes(s, p) / a``
   to the next position, with TE's ring charges (:func:`~.charges.te_ring_bytes` once,
   :func:`~.charges.te_step_bytes` per step); ``p = 1`` is one call (TE's plain ``a2a``);
3. all-to-all out (the same bytes back: output forward; dq, dk, dv backward), permutes as in 1.

Linear modules run on each rank's tokens before and after (halves).

Sequences are packed into the CP groups as ``te-cp`` packs them
(:func:`~.te_cp.cp_groups`: by tokens, longest first); a sequence shorter than
``2 cp`` tokens is kept whole on the group rank holding the fewest tokens (in
TE's favour: TE pads it), run as one call after the group's attention.

**Heads**: TE's all-to-all reshapes heads into ``a`` groups and asserts that the
query and key/value heads (per tensor-parallel rank) are divisible by it
("The number of attention heads needs to be divisible by CP size!"); there is no
fallback, so a size ``a`` that does not divide both is refused.

**Sizes**: ``(a, p)`` with ``a >= 2`` a power of two dividing the GPUs per node
and both head counts, ``p`` a power of two, ``a p`` dividing the world and large
enough for the longest sequence; the pair whose simulated step is fastest for
this batch is used (``a = 1`` is plain ``te-cp``).

Example: 2 nodes x 4 GPUs, 32 heads, ``a = 4, p = 2``: one CP group of 8 ranks;
all-to-alls inside ranks ``0-3`` and ``4-7``; rings ``(0, 4)``, ``(1, 5)``, ``(2, 6)``,
``(3, 7)`` over the NICs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from ..planner.plan import PlanError
from ..planner.zigzag import zigzag_tokens
from .charges import hbm_ms, peer_a2a_permutes, shape_of
from .peer_plan import PeerPlan, as_peer_plan
from .peer_programs import ProgramBuilder
from .planbuild import build_plan
from .program import LayerProgram
from .te_cp import cp_groups

__all__ = ["A2AP2P", "size_candidates", "heads_divisible", "a2a_p2p_plan", "a2a_p2p_program"]


@dataclass(frozen=True)
class A2AP2P:
    """Hierarchical CP sizes: ``a2a`` ranks per all-to-all group, ``p2p`` ring positions."""

    a2a: int
    p2p: int

    @property
    def cp(self) -> int:
        return self.a2a * self.p2p


def heads_divisible(cost: CostModel, a2a: int) -> bool:
    """Query and key/value heads per TP rank both divisible by ``a2a`` (TE's assertion)."""
    kv = cost.model.kv_heads // cost.tensor_parallel
    return cost.heads % a2a == 0 and kv % a2a == 0


def size_candidates(lengths: Sequence[int], cost: CostModel) -> list[A2AP2P]:
    """Every ``(a, p)`` TE accepts for this batch on this cluster (module docstring, "Sizes")."""
    cl = cost.cluster
    world, cap = cl.world_size, cl.tokens_per_gpu
    out = []
    a = 2
    while a <= cl.gpus_per_node:
        if cl.gpus_per_node % a == 0 and heads_divisible(cost, a):
            p = 1
            while a * p <= world:
                if world % (a * p) == 0 and -(-max(lengths) // (a * p)) <= cap:
                    out.append(A2AP2P(a, p))
                p *= 2
        a *= 2
    return out


def _plan_for(lengths: Sequence[int], cluster: Cluster, cost: CostModel, sizes: A2AP2P) -> PeerPlan:
    base = build_plan(lengths, cp_groups(lengths, cluster, sizes.cp), cluster, cost, local_slots=False,
                      with_prediction=False)
    return as_peer_plan(base, sizes, build=a2a_p2p_program)


def a2a_p2p_plan(lengths: Sequence[int], cluster: Cluster, cost: CostModel, *,
                 a2a: int | None = None, p2p: int | None = None) -> tuple[PeerPlan, A2AP2P]:
    """The plan at sizes ``(a2a, p2p)`` (both given), else at the fastest simulated candidate.

    Raises:
        PlanError: sizes TE refuses (heads not divisible, ``a2a`` not inside a node, ...) or none fits.
    """
    from .simulator import Fastest

    cands = size_candidates(lengths, cost)
    if (a2a is None) != (p2p is None):
        raise PlanError(f"te-cp-a2a-p2p: give both a2a and p2p sizes or neither (got a2a={a2a}, p2p={p2p})")
    if a2a is not None and p2p is not None:
        want = A2AP2P(a2a, p2p)
        if want not in cands:
            kv = cost.model.kv_heads // cost.tensor_parallel
            raise PlanError(f"te-cp-a2a-p2p: sizes a2a={a2a}, p2p={p2p} are not allowed here: a2a must be a power "
                            f"of two >= 2 dividing {cluster.gpus_per_node} GPUs per node, {cost.heads} query heads "
                            f"and {kv} kv heads; a2a x p2p must divide {cluster.world_size} GPUs and hold "
                            f"{max(lengths)} tokens at {cluster.tokens_per_gpu} per GPU; allowed: "
                            f"{[(c.a2a, c.p2p) for c in cands]}")
        return _plan_for(lengths, cluster, cost, want), want
    if not cands:
        raise PlanError(f"te-cp-a2a-p2p: no all-to-all size >= 2 divides {cluster.gpus_per_node} GPUs per node, "
                        f"{cost.heads} query heads and {cost.model.kv_heads // cost.tensor_parallel} kv heads "
                        f"(or no CP size holds the longest sequence)")
    fastest: Fastest[tuple[PeerPlan, A2AP2P]] = Fastest()
    for c in cands:
        try:
            plan = _plan_for(lengths, cluster, cost, c)
        except PlanError:
            continue
        fastest.simulate(plan, cost, (plan, c), attention_comm="a2a_p2p")
    if fastest.kept is None:
        raise PlanError(f"te-cp-a2a-p2p: no sizes in {[(c.a2a, c.p2p) for c in cands]} can pack the batch")
    return fastest.kept


def a2a_p2p_program(plan: PeerPlan, cost: CostModel) -> LayerProgram:
    """One layer of a TE CP a2a+p2p plan (module docstring)."""
    sizes: A2AP2P = plan.peer
    a, p = sizes.a2a, sizes.p2p
    b = ProgramBuilder(cost)
    per_token = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    sh = shape_of(cost)
    for r in range(plan.world_size):
        b.compute(r, cost.linear_ms(plan.tokens(r, "linear")) / 2, "linear", "linear (first half)")
    for ring in plan.rings:
        g = len(ring.ranks)
        if g != a * p:
            raise ValueError(f"te-cp-a2a-p2p: a group of {g} ranks in a plan of cp = {a} x {p}")
        lengths = [plan.sequences[i].length for i in ring.seqs]
        held: dict[int, int] = defaultdict(int)
        for i in ring.seqs:
            s = plan.sequences[i]
            for pos, r in enumerate(s.ranks):
                held[r] += zigzag_tokens(s.length, g, pos)
        subgroups = [ring.ranks[j * a:(j + 1) * a] for j in range(p)]
        label = f"cp group {list(ring.ranks)[:2]}.. ({a}x{p}, {len(lengths)} seqs)"
        a2a = {(x, y): held[x] * per_token / a for sg in subgroups for x in sg for y in sg if x != y}
        tin = b.pairs(("a2a_p2p", ring.ranks, "in"), a2a)
        tout = b.pairs(("a2a_p2p", ring.ranks, "out"), {(y, x): v for (x, y), v in a2a.items()})
        got = {r: sum(held[x] for x in sg) / a for sg in subgroups for r in sg}  # tokens' worth received
        permute = {r: {k: hbm_ms(cost, x) for k, x in peer_a2a_permutes(sh, "te", held[r], got[r]).items()}
                   for r in ring.ranks}
        for r in ring.ranks:
            b.compute(r, permute[r][("in", 0)], "copy", f"{label} all-to-all in: sender's permute")
            b.post(r, tin)
            b.wait(r, tin, "group", f"{label} all-to-all in")
            b.compute(r, permute[r][("in", 1)], "copy", f"{label} all-to-all in: receiver's permute")
        if p == 1:
            comp = sum(cost.causal_ms(s) for s in lengths) / a
            for r in ring.ranks:
                b.compute(r, comp, "attention", f"{label} a2a attention")
        else:
            diag = sum(cost.ring_compute_profile(s, p)[0] for s in lengths) / a
            off = sum(cost.ring_compute_profile(s, p)[1] for s in lengths) / a
            nbytes = 3 * sum(cost.ring_step_bytes(s, p) for s in lengths) / a
            for i in range(a):
                ranks = tuple(sg[i] for sg in subgroups)
                b.ring(ranks, nbytes, diag, off, key=("a2a_p2p", ring.ranks, "ring", i), label=f"{label} ring {i}")
        for r in ring.ranks:
            b.compute(r, permute[r][("out", 0)], "copy", f"{label} all-to-all out: sender's permute")
            b.post(r, tout)
            b.wait(r, tout, "group", f"{label} all-to-all out")
            b.compute(r, permute[r][("out", 1)], "copy", f"{label} all-to-all out: receiver's permute")
    local: dict[int, list[int]] = defaultdict(list)
    for s in plan.sequences:
        if s.placement == "local":
            local[s.ranks[0]].append(s.length)
    for r, lens in sorted(local.items()):
        b.compute(r, sum(cost.local_ms(n) for n in lens), "local", "whole sequences (shorter than 2 cp)")
    for r in range(plan.world_size):
        b.compute(r, cost.linear_ms(plan.tokens(r, "linear")) / 2, "linear", "linear (second half)")
    return b.program()
