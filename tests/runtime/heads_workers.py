"""Head-parallel rings on gloo: checks that run inside spawned ranks (module-level so spawn can pickle them).

Random plans (``random_plan(..., n_head_rings=, head_widths=)``) mix head-parallel rings (Ulysses: one
block; hybrid: blocks on several nodes) with plain intra- and inter-node rings and local sequences, so
ranks sit in several rings of both kinds, and local sequences run inside a ring's ``heads`` all-to-all
(local slots at step -1). Per plan: the all-to-all transfers' messages through the
router, the engine's trace against the lowered program (routing on and off), outputs and dq/dk/dv
against float64 per-sequence SDPA (float64 to 1e-9, float32 to 1e-5) for MHA and GQA head counts,
including K/V heads replicated over lanes (``Hkv < a2a``), with and without the kernel's
``backward_into`` (a Ulysses ring's gradients written into the send buffer, or copied there), and bf16
gradients sent home in bf16 bit for bit
against the same run with them sent in float32. Then heads that cannot split over a
ring's width: every rank raises before any work, naming the ring, the width and the heads; world 4
also runs a node-interleaved rank map and a sub-group.
"""

from __future__ import annotations

import torch

from plan_factory import random_plan
from runtime_workers import check_attention, check_router, check_trace, expect_error
from zeppelin_megatron.planner.head_parallel import head_split_error, lanes_share_kv
from zeppelin_megatron.planner.lowering import lower
from zeppelin_megatron.planner.plan import StepPlan
from zeppelin_megatron.runtime import RuntimeInputError, ZeppelinGroup, zeppelin_attention
from zeppelin_megatron.runtime.engine import AttentionEngine
from zeppelin_megatron.runtime.kernels import get_kernel

# world -> ((nodes, gpus per node, block widths, (Hq, Hkv) cases), ...); every case splits over every width
TOPOLOGIES: dict[int, tuple[tuple[int, int, tuple[int, ...], tuple[tuple[int, int], ...]], ...]] = {
    2: ((1, 2, (2,), ((8, 8), (8, 2), (8, 1))),),
    4: ((2, 2, (2,), ((8, 8), (8, 2), (8, 1))), (1, 4, (2, 4), ((8, 8), (8, 2), (8, 1)))),
    6: ((2, 3, (3,), ((6, 3), (12, 3), (6, 1))), (3, 2, (2,), ((8, 2), (8, 1), (4, 4)))),
    8: ((2, 4, (2, 4), ((8, 8), (8, 2), (8, 1))), (4, 2, (2,), ((8, 8), (8, 1), (4, 2)))),
}
BAD_HEADS = ((12, 4), (3, 1), (6, 2), (5, 5))  # (12, 4): 3 lanes and 4 K/V heads; (3, 1): 2 or 4 lanes


def head_plan(seed: int, nodes: int, gpn: int, widths: tuple[int, ...], max_len: int = 40) -> StepPlan:
    """The first random plan of seeds ``seed + 7919 t`` with a Ulysses ring and, on several nodes, a hybrid
    one, a local slot inside the heads all-to-all (step -1) of the hybrid (one node: Ulysses) ring, a
    head-parallel sequence of odd length and a rank in a head-parallel ring and another ring."""
    want = {1, 2} if nodes > 1 else {1}
    for t in range(300):
        plan = random_plan(seed + 7919 * t, nodes, gpn, n_local=4, n_intra_rings=1, n_inter_rings=1, n_head_rings=2,
                           head_widths=widths, max_len=max_len)
        inside = {min(plan.rings[x.ring].blocks, 2) for x in plan.local_slots if x.step == -1}
        odd = any(plan.sequences[i].length % 2 for r in plan.rings if r.a2a > 1 for i in r.seqs)
        if {min(r.blocks, 2) for r in plan.rings if r.a2a > 1} == want and max(want) in inside and odd \
                and shared_ranks(plan):
            return plan
    raise AssertionError(f"no plan with head-parallel rings of {sorted(want)} blocks, a step -1 slot, an odd length "
                         f"and shared ranks from seed {seed}")


def shared_ranks(plan: StepPlan) -> bool:
    """Some rank is a member of a head-parallel ring and of another ring."""
    return any(sum(r in ring.ranks for ring in plan.rings) >= 2 and any(r in ring.ranks for ring in plan.rings
                                                                      if ring.a2a > 1)
               for r in range(plan.world_size))


def check_bf16_wire(group: ZeppelinGroup, plan: StepPlan, hq: int, hkv: int) -> bool:
    """bf16 inputs: a hybrid ring's dq, dk, dv sent home in bf16 (cast once on the sender,
    ``heads.grads_wire_dtype``) give the same output and gradients, bit for bit, as the same run with them sent in
    float32 and cast at home (each element is rounded once either way). Returns whether the plan has a ring of
    several blocks whose gradients the choice changes (lanes not sharing K/V heads)."""
    import zeppelin_megatron.runtime.engine as engine_mod
    from runtime_workers import gather, global_data

    rank = group.rank
    data = global_data(plan, hq, hkv, 4, seed=3)
    lin = plan.linear_layout[rank]
    e = lambda h: torch.zeros(0, h, 4, dtype=torch.float64)  # noqa: E731

    def run() -> list[torch.Tensor]:
        q, k, v = (gather(lin, [x[i] for x in data], e(hkv if i else hq)).to(torch.bfloat16).requires_grad_(True)
                   for i in range(3))
        out = zeppelin_attention(q, k, v, plan, group, softmax_scale=0.35, backend="reference")
        out.backward(gather(lin, [x[3] for x in data], e(hq)).to(torch.bfloat16))
        return [out.detach(), q.grad, k.grad, v.grad]

    narrow = run()
    real = engine_mod.grads_wire_dtype
    engine_mod.grads_wire_dtype = lambda index, dtype, acc: acc  # the float32 wire (the engine before 2026-11-27)
    try:
        wide = run()
    finally:
        engine_mod.grads_wire_dtype = real
    what = f"rank {rank} plan {plan.nodes}x{plan.gpus_per_node} Hq={hq} Hkv={hkv}"
    for name, a, b in zip(("out", "dq", "dk", "dv"), narrow, wide):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b), f"{what}: bf16 {name} differs with an fp32 wire"
    return any(r.a2a > 1 and r.blocks > 1 and not lanes_share_kv(hkv, r.a2a) for r in plan.rings)


def check_without_backward_into(group: ZeppelinGroup, plan: StepPlan, hq: int, hkv: int) -> None:
    """The engine's path for kernels without ``backward_into`` (TE, torch varlen): a Ulysses ring's one call
    returns dq, dk, dv and :meth:`~zeppelin_megatron.runtime.heads.HeadIndex.grads_to_tokens` copies them into
    the send buffer; exact against float64 SDPA as the in-place path is (the reference kernel with its
    ``backward_into`` hidden)."""
    from zeppelin_megatron.runtime.kernels.reference import ReferenceKernel

    assert any(r.a2a > 1 and r.blocks == 1 for r in plan.rings), "no Ulysses ring in the plan"
    into = ReferenceKernel.backward_into
    del ReferenceKernel.backward_into  # type: ignore[attr-defined]
    try:
        assert not hasattr(get_kernel("reference", torch.device("cpu"), torch.float64), "backward_into")
        check_attention(group, plan, dtype=torch.float64, routing=False, hq=hq, hkv=hkv, d=4, seed=5)
    finally:
        ReferenceKernel.backward_into = into  # type: ignore[method-assign]


def check_head_errors(group: ZeppelinGroup, plan: StepPlan, good: tuple[int, int]) -> None:
    """Heads that a head-parallel ring's lanes cannot split: every rank raises before any work
    (through the start-of-call check, and with it off), naming the first such ring, its width and the
    heads; the engine raises ``ValueError`` on construction. A good call (``good`` heads) works afterwards."""
    rank, cpu = group.rank, torch.device("cpu")
    widths = {r.a2a for r in plan.rings if r.a2a > 1}
    hq, hkv = next(h for h in BAD_HEADS if any(head_split_error(*h, a) for a in widths))
    k, ring = next((k, r) for k, r in enumerate(plan.rings) if r.a2a > 1 and head_split_error(hq, hkv, r.a2a))
    named = (f"ring {k} (ranks {list(ring.ranks)}, sequences {list(ring.seqs)}) is head-parallel over {ring.a2a} "
             f"lanes, but the heads Hq={hq}, Hkv={hkv} cannot split")
    n = plan.tokens(rank, "linear")
    q = torch.randn(n, hq, 4, dtype=torch.float64)
    kv = torch.randn(n, hkv, 4, dtype=torch.float64)
    expect_error(RuntimeInputError, named, lambda: zeppelin_attention(q, kv, kv, plan, group))
    expect_error(RuntimeInputError, named, lambda: zeppelin_attention(q, kv, kv, plan, group, check_plan=False))
    kernel = get_kernel("reference", cpu, torch.float64)
    expect_error(ValueError, named, lambda: AttentionEngine(
        plan, group, kernel=kernel, scale=0.5, routes=(), hkv=hkv, head_dim=4, dtype=torch.float64, device=cpu,
        hq=hq))
    q, kv = torch.randn(n, good[0], 4, dtype=torch.float64), torch.randn(n, good[1], 4, dtype=torch.float64)
    assert zeppelin_attention(q, kv, kv, plan, group, backend="reference").shape == q.shape


def run_heads(rank: int, world: int, n_plans: int, full: bool, seed0: int = 0, topologies: int = 99) -> None:
    """``n_plans`` random plans per topology of the first ``topologies`` of :data:`TOPOLOGIES` ``[world]``
    (every check above; ``full``:
    every head case in float64 too), then the head-split errors. Asserts that the plans put a rank in a
    head-parallel ring and another ring, had odd-length head-parallel sequences, and (several nodes)
    both Ulysses and hybrid rings."""
    shared = narrowed = False
    kinds: set[str] = set()
    odd = False
    for nodes, gpn, widths, heads in TOPOLOGIES[world][:topologies]:
        assert all(head_split_error(hq, hkv, a) is None for hq, hkv in heads for a in widths), (widths, heads)
        group = ZeppelinGroup(process_group=None, gpus_per_node=gpn)
        for p_idx in range(n_plans):
            plan = head_plan(seed0 + 1000 * world + 10 * nodes + p_idx, nodes, gpn, widths)
            assert any(r.a2a > 1 for r in plan.rings), "no head-parallel ring in the plan"
            shared |= shared_ranks(plan)
            kinds |= {"ulysses" if r.blocks == 1 else "hybrid" for r in plan.rings if r.a2a > 1}
            odd |= any(plan.sequences[i].length % 2 for r in plan.rings if r.a2a > 1 for i in r.seqs)
            for t in lower(plan).transfers.values():  # the all-to-alls: several messages per rank
                if t.id.kind in ("heads", "tokens"):
                    check_router(group, t.messages, unit=3, into=True)
            hq, hkv = heads[p_idx % len(heads)]
            check_trace(group, plan, routing=True, hq=hq, hkv=hkv)
            check_trace(group, plan, routing=False, hq=hq, hkv=hkv, dtype=torch.bfloat16)  # wire dtypes
            narrowed |= check_bf16_wire(group, plan, hq, hkv)
            # every head case in float32 (routing on and off by turns), one in float64
            cases = [(torch.float64, p_idx % 2 == 0, *heads[p_idx % len(heads)])]
            cases += [(torch.float32, (i + p_idx) % 2 == 0, hq, hkv) for i, (hq, hkv) in enumerate(heads)]
            if full:
                cases += [(torch.float64, r, hq, hkv) for hq, hkv in heads for r in (True, False)]
            for dtype, routing, hq, hkv in cases:
                check_attention(group, plan, dtype=dtype, routing=routing, hq=hq, hkv=hkv, d=4, seed=p_idx)
            if p_idx == 0:  # a kernel without backward_into: a Ulysses ring's gradients copied into the send buffer
                check_without_backward_into(group, plan, *heads[-1])
        check_head_errors(group, head_plan(seed0 + 7, nodes, gpn, widths), heads[0])
    if world == 4:  # other process groups: a node-interleaved rank map, a sub-group of two ranks
        import torch.distributed as dist
        group = ZeppelinGroup(process_group=None, gpus_per_node=2, rank_map=(0, 2, 1, 3))
        check_attention(group, head_plan(seed0 + 31, 2, 2, (2,)), dtype=torch.float64, routing=True, hq=8, hkv=1,
                        d=4)
        sub = dist.new_group([2, 3])
        if rank >= 2:
            g2 = ZeppelinGroup(process_group=sub, gpus_per_node=2)
            check_attention(g2, head_plan(seed0 + 32, 1, 2, (2,)), dtype=torch.float32, routing=False, hq=8,
                            hkv=2, d=4)
    assert shared, "no plan put a rank in a head-parallel ring and another ring"
    assert odd, "no head-parallel ring had a sequence of odd length"
    multi = any(nodes > 1 for nodes, *_ in TOPOLOGIES[world][:topologies])
    assert kinds == ({"ulysses", "hybrid"} if multi else {"ulysses"}), kinds
    assert narrowed or not multi, "no hybrid ring sent its gradients home in bf16"
