"""Checks in spawned gloo ranks for plans whose rows are contiguous (``plan_step``'s engine order).

``plan_step`` writes every rank's attention layout ring by ring, then local chunk by local chunk
(:func:`~zeppelin_megatron.planner.api.engine_order`), so the engine reads each ring's and each local
call's rows as views and writes them as slices; the random plans of :mod:`plan_factory` shuffle ranges
and keep the gather path covered (``runtime_workers.run_all``).
"""

from __future__ import annotations

import torch

from plan_factory import small_batch
from runtime_workers import check_attention, check_trace, expect_error, gather, global_data
from zeppelin_megatron.planner import CostModel, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.lowering import lower
from zeppelin_megatron.planner.options import PlannerOptions
from zeppelin_megatron.planner.plan import StepPlan
from zeppelin_megatron.runtime import ZeppelinGroup
from zeppelin_megatron.runtime.engine import AttentionEngine
from zeppelin_megatron.runtime.kernels import get_kernel


def planned(spec: str, seed: int, head_parallel: bool) -> StepPlan:
    """A ``plan_step`` plan of one long sequence, one medium and up to 12 short ones (96 tokens per GPU):
    on 2x2, seeds 1 and 3 give two intra-node rings with local slots, 2 an inter-node ring of 4 with
    slots, 5 an inter-node ring of 4 and an intra-node ring sharing ranks 0 and 1."""
    cost = CostModel(model=load_model(None), cluster=load_cluster(spec, tokens_per_gpu=96))
    return plan_step(small_batch(seed, cost.cluster.world_size), cost, PlannerOptions(head_parallel=head_parallel))


def spans(plan: StepPlan, rank: int) -> list[tuple[int, int] | None]:
    """The spans of rank ``rank``'s member rings and local chunks (None: not contiguous)."""
    prog = lower(plan).ranks[rank]
    return [p.span for p in prog.rings if p.position is not None] + [c.span for c in prog.local_chunks]


def _engine(group: ZeppelinGroup, plan: StepPlan, seed: int) -> tuple[AttentionEngine, tuple[torch.Tensor, ...]]:
    """A float64 reference-kernel engine for this rank and its ``(q, k, v, dout)`` in the attention layout (Hq 4,
    Hkv 2, D 4)."""
    rank, cpu, d, hq, hkv = group.rank, torch.device("cpu"), 4, 4, 2
    data = global_data(plan, hq, hkv, d, seed=seed)
    att = plan.attention_layout[rank]
    e = lambda h: torch.zeros(0, h, d, dtype=torch.float64)  # noqa: E731
    qkvd = tuple(gather(att, [x[i] for x in data], e(hkv if i in (1, 2) else hq)) for i in range(4))
    eng = AttentionEngine(plan, group, kernel=get_kernel("reference", cpu, torch.float64), scale=0.3, routes=(),
                          hkv=hkv, head_dim=d, dtype=torch.float64, device=cpu, hq=hq)
    return eng, qkvd


def check_inplace_refused(group: ZeppelinGroup, plan: StepPlan) -> None:
    """A ring's output is saved as a view of ``out``: changing ``out`` in place before backward raises."""
    eng, (q, k, v, dout) = _engine(group, plan, seed=3)
    out, saved = eng.forward(q, k, v)
    views = [key for key in saved if isinstance(key, tuple) and key[0] == "out_view"]
    if not views:  # no member ring with contiguous rows here: nothing saved as a view
        return
    out.mul_(2.0)
    expect_error(RuntimeError, "modified in place", lambda: eng.backward(dout, q, k, v, saved))


def run_contiguous(rank: int, world: int) -> None:
    """2x2 plans from ``plan_step`` (plain rings; one with head-parallel rings): all rows contiguous, trace
    (views where the rows allow, checked by ``check_trace``) and exactness in float64 and float32; then a
    plan's layout reversed on every rank (same plan otherwise): gathers, same trace and results."""
    assert world == 4
    group = ZeppelinGroup(process_group=None, gpus_per_node=2)
    cases = [(1, False), (2, False), (5, False), (3, True)]
    for seed, hp in cases:
        plan = planned("2x2", seed, hp)
        assert plan.rings and (not hp or any(r.a2a > 1 for r in plan.rings)), (seed, hp)  # hp: Ulysses rings
        assert all(s is not None for s in spans(plan, rank)), (rank, seed, spans(plan, rank))
        check_trace(group, plan, routing=True)
        check_trace(group, plan, routing=False)
        for dtype, routing, hq, hkv in ((torch.float64, True, 4, 2), (torch.float32, False, 4, 4)):
            check_attention(group, plan, dtype=dtype, routing=routing, hq=hq, hkv=hkv, seed=seed)
        check_inplace_refused(group, plan)
    plan = planned("2x2", 5, False)
    rev = tuple(tuple(reversed(rs)) for rs in plan.attention_layout)
    lin = rev if plan.linear_layout == plan.attention_layout else plan.linear_layout
    shuffled = StepPlan(nodes=plan.nodes, gpus_per_node=plan.gpus_per_node, sequences=plan.sequences,
                        attention_layout=rev, linear_layout=lin, routing=plan.routing, local_slots=plan.local_slots,
                        remap_proxies=plan.remap_proxies)
    assert any(s is None for r in range(world) for s in spans(shuffled, r))
    check_trace(group, shuffled, routing=True)
    check_attention(group, shuffled, dtype=torch.float64, routing=True, hq=4, hkv=2)


def check_whole(group: ZeppelinGroup, plan: StepPlan) -> bool:
    """A rank whose program is one local call over its whole buffer (``RankProgram.whole_chunk``) returns the
    kernel's output itself (saved as it is returned, no zero-filled ``out``) and its gradients; changing the
    output in place before backward raises. -> whether this rank took that path."""
    if lower(plan).ranks[group.rank].whole_chunk is None:
        return False
    eng, (q, k, v, dout) = _engine(group, plan, seed=5)
    out, saved = eng.forward(q, k, v)
    assert saved[("local", 0)][0] is out and ("whole", 0) in saved
    dq, dk, dv = eng.backward(dout, q, k, v, saved)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    out.mul_(2.0)
    expect_error(RuntimeError, "modified in place", lambda: eng.backward(dout, q, k, v, saved))
    return True


def run_whole(rank: int, world: int, spec: str = "2x2") -> None:
    """``spec`` (nodes x GPUs, ``world`` ranks): a plan with every sequence local and no remap (every rank one whole
    call) and the default ``plan_step`` plan of a batch with one long sequence (on 2x2 a packed plan with a ring
    and ringless ranks): exact in float64 (GQA, Hq 4 / Hkv 2) and float32 (MHA) against per-sequence SDPA, the
    lowered trace, and the whole path taken where ``whole_chunk`` says (every rank of the all-local plan)."""
    nodes, gpn = map(int, spec.split("x"))
    assert world == nodes * gpn
    group = ZeppelinGroup(process_group=None, gpus_per_node=gpn)
    cost = CostModel(model=load_model(None), cluster=load_cluster(spec, tokens_per_gpu=96 if world >= 4 else 200))
    local = plan_step([60, 50, 41, 30, 23, 17, 10, 5, 3], cost, PlannerOptions(placements=("local",), remap=False))
    packed = plan_step([150, 40, 37, 33, 29, 21, 11, 9, 5], cost)
    if spec == "2x2":
        assert packed.origin == "packed" and packed.rings and packed.linear_layout == packed.attention_layout
    for plan in (local, packed):
        took = check_whole(group, plan)
        assert took or plan is packed
        check_trace(group, plan, routing=False)
        for dtype, hq, hkv in ((torch.float64, 4, 2), (torch.float32, 4, 4)):
            check_attention(group, plan, dtype=dtype, routing=True, hq=hq, hkv=hkv, seed=7)


def wide_plan(head_parallel: bool) -> StepPlan:
    """A packed plan with a wide span on 2 x 4 GPUs (96 tokens each): 160 tokens sharded over ranks 0-3 (the span),
    the other sequences packed at ``cp = 2`` from 50 tokens on (rings (0, 1), (2, 3), (4, 5), (6, 7)), so ranks
    0-3 hold two rings each; finished without a remap as ``best_packed`` finishes a candidate."""
    from dataclasses import replace

    from zeppelin_megatron.planner import api
    from zeppelin_megatron.planner.packed import packed_assignments
    cost = CostModel(model=load_model(None), cluster=load_cluster("2x4", tokens_per_gpu=96))
    lengths = [160, 110, 90, 70, 60, 50, 30, 20, 11, 7]
    assignments = packed_assignments(lengths, cost, 2, head_parallel=True, shard_from=50, absorb=True, wide=[(0, 4)])
    assert assignments is not None
    options = PlannerOptions(head_parallel=head_parallel, remap=False)
    return api._candidate(lengths, assignments, cost, replace(options, remap=False)).evolve(origin="packed")


def run_wide(rank: int, world: int) -> None:
    """Wide-span packed plans (:func:`wide_plan`, head-parallel and plain rings): a rank in two rings of different
    sizes, the lowered trace, and exactness in float64 (GQA, Hq 4 / Hkv 2) and float32 (MHA) against per-sequence
    SDPA, forward and backward."""
    assert world == 8
    group = ZeppelinGroup(process_group=None, gpus_per_node=4)
    for hp in (True, False):
        plan = wide_plan(hp)
        sizes = {len(r.ranks) for r in plan.rings}
        assert sizes == {2, 4} and sum(0 in r.ranks for r in plan.rings) == 2, [r.ranks for r in plan.rings]
        assert hp == any(r.a2a > 1 for r in plan.rings)
        check_trace(group, plan, routing=False)
        for dtype, hq, hkv in ((torch.float64, 4, 2), (torch.float32, 4, 4)):
            check_attention(group, plan, dtype=dtype, routing=True, hq=hq, hkv=hkv, seed=11)


PARTS_SPECS = {2: "1x2", 4: "2x2", 6: "2x3", 8: "2x4"}
"""World size -> the nodes x GPUs :func:`parts_plan` and :func:`run_parts` use."""


def parts_plan(spec: str, engine: bool) -> StepPlan:
    """Head-parallel rings in parts (planner/ring_parts.py) on ``spec``: over every rank of node 0 a Ulysses ring
    in two parts (37 + 9 tokens, then 23), with a step ``-1`` slot of a local sequence in part 0 on rank 0 and one
    in part 1 on the last rank of the node; on two nodes also a hybrid ring over all ranks (blocks of one node) in
    three parts (41, 29 + 19, 21), so node 0's ranks are in five rings, and local sequences after the rings.
    Odd lengths throughout. ``engine``: the layout in engine order (views), else zigzag (gathers)."""
    import sys
    from pathlib import Path

    from zeppelin_megatron.planner.api import engine_order
    from zeppelin_megatron.planner.plan import LocalSlot, SequencePlan

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from zigzag_plans import zigzag_plan

    nodes, gpn = map(int, spec.split("x"))
    node0 = tuple(range(gpn))
    items: list[tuple[int, tuple[int, ...], int]] = [(37, node0, gpn), (9, node0, gpn), (23, node0, gpn)]
    part = [0, 0, 1]
    if nodes > 1:
        every = tuple(range(nodes * gpn))
        items += [(41, every, gpn), (29, every, gpn), (19, every, gpn), (21, every, gpn)]
        part += [0, 1, 1, 2]
    last = gpn - 1
    local = ((5, 0), (7, last), (3, last), (11, nodes * gpn - 1))
    base = zigzag_plan(items, nodes, gpn, local=local)
    n = len(items)
    seqs = tuple(SequencePlan(s.length, s.placement, s.ranks, s.a2a, part[i]) if i < n else s
                 for i, s in enumerate(base.sequences))
    plan = base.evolve(sequences=seqs)
    index = {(r.ranks, r.part): k for k, r in enumerate(plan.rings)}
    slots = (LocalSlot(0, index[(node0, 0)], -1, (n,)), LocalSlot(last, index[(node0, 1)], -1, (n + 1,)))
    plan = plan.evolve(local_slots=slots).validated()
    return engine_order(plan) if engine else plan


def run_parts(rank: int, world: int) -> None:
    """:func:`parts_plan` at this world size: several rings over the same ranks at one width, the lowered trace, and
    exactness in float64 (GQA) and float32 (MHA) against per-sequence SDPA, forward and backward, with rows in
    engine order and in zigzag order."""
    spec = PARTS_SPECS[world]
    nodes, gpn = map(int, spec.split("x"))
    group = ZeppelinGroup(process_group=None, gpus_per_node=gpn)
    hq, hkv = (6, 3) if gpn == 3 else (4, 2)
    for engine in (True, False):
        plan = parts_plan(spec, engine)
        assert sorted(r.part for r in plan.rings if r.ranks == tuple(range(gpn))) == [0, 1]
        assert nodes == 1 or sorted(r.part for r in plan.rings if len(r.ranks) == world) == [0, 1, 2]
        check_trace(group, plan, routing=False, hq=hq, hkv=hkv)
        for dtype, kv in ((torch.float64, hkv), (torch.float32, hq)):
            check_attention(group, plan, dtype=dtype, routing=True, hq=hq, hkv=kv, seed=13)
