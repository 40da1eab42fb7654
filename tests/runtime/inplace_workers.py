"""Checks in spawned gloo ranks for staying rows (issue 12 item 4): rows that stay on their rank skip the
remap's exchange (``RankExchange.keep_src`` / ``keep_dst``) and local chunks whose sequences stay run in place
on the linear rows (``LocalChunk.linear_rows``, ``runtime/overlap.py``).

Per plan (:func:`window_plan.window_plan` plans, with and without their remap windows, direct and routed): the
remap round trip is bitwise the identity and lands each row where the attention layout says; zeppelin_attention's
out, dq, dk, dv against float64 per-sequence SDPA (MHA and GQA); bitwise the same as the plain path (the
packed remap in, :class:`~zeppelin_megatron.runtime.engine.EngineFunction` with every local chunk at its
attention rows, the remap out); a plan whose linear layout is its attention layout runs no collective.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

import runtime_workers
from runtime_workers import check_attention, gather, global_data
from window_workers import window_plan
from zeppelin_megatron.planner.lowering import lower
from zeppelin_megatron.planner.plan import StepPlan
from zeppelin_megatron.runtime import ZeppelinGroup, zeppelin_attention
from zeppelin_megatron.runtime import remap as remap_mod
from zeppelin_megatron.runtime.engine import AttentionEngine, EngineFunction
from zeppelin_megatron.runtime.kernels import get_kernel
from zeppelin_megatron.runtime.remap import qkv_to_attention, remap_tokens, to_linear


def _inputs(plan: StepPlan, rank: int, dtype: torch.dtype, hq: int, hkv: int, d: int = 8) -> list[torch.Tensor]:
    data = global_data(plan, hq, hkv, d, seed=3)
    lin = plan.linear_layout[rank]
    e = lambda h: torch.zeros(0, h, d, dtype=torch.float64)  # noqa: E731
    return [gather(lin, [x[i] for x in data], e(hkv if i in (1, 2) else hq)).to(dtype) for i in range(4)]


def check_round_trip(group: ZeppelinGroup, plan: StepPlan) -> None:
    """``to_attention`` puts each row where the attention layout says; ``to_linear`` brings it back bitwise."""
    rank = group.rank
    ids = [torch.arange(s.length, dtype=torch.float64) + 1000 * i for i, s in enumerate(plan.sequences)]
    x = gather(plan.linear_layout[rank], ids, torch.zeros(0, dtype=torch.float64))[:, None, None].repeat(1, 3, 2)
    y = remap_tokens(x, plan, group, "to_attention")
    want = gather(plan.attention_layout[rank], ids, torch.zeros(0, dtype=torch.float64))
    assert torch.equal(y[:, 0, 0], want), f"rank {rank}: to_attention misplaces rows"
    assert torch.equal(remap_tokens(y, plan, group, "to_linear"), x), f"rank {rank}: the round trip differs"


def _plain(group: ZeppelinGroup, plan: StepPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           dout: torch.Tensor, routing: bool) -> list[torch.Tensor]:
    """The path before in-place chunks: remap in, the engine on attention rows only, remap out."""
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    engine = AttentionEngine(plan, group, kernel=get_kernel("reference", q.device, q.dtype), scale=0.4,
                             routes=plan.routing if routing else (), hkv=k.shape[1], head_dim=q.shape[2],
                             dtype=q.dtype, device=q.device, hq=q.shape[1])
    q_a, k_a, v_a = qkv_to_attention(q, k, v, plan, group)
    out = to_linear(EngineFunction.apply(q_a, k_a, v_a, engine), plan, group)
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def check_same_as_plain(group: ZeppelinGroup, plan: StepPlan, *, dtype: torch.dtype, hq: int, hkv: int,
                        routing: bool) -> None:
    q, k, v, dout = _inputs(plan, group.rank, dtype, hq, hkv)
    want = _plain(group, plan.evolve(remap_slots=()), q, k, v, dout, routing)
    q_, k_, v_ = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = zeppelin_attention(q_, k_, v_, plan, group, softmax_scale=0.4, routing=routing, backend="reference")
    out.backward(dout)
    for nm, a, b in zip(("out", "dq", "dk", "dv"), (out.detach(), q_.grad, k_.grad, v_.grad), want):
        assert torch.equal(a, b), f"rank {group.rank} {dtype} Hq={hq} Hkv={hkv}: {nm} differs from the plain path"


def check_no_remap(group: ZeppelinGroup, plan: StepPlan) -> None:
    """Linear layout = attention layout: no collective of the remap runs, the results are exact."""
    same = replace(plan, linear_layout=plan.attention_layout, remap_slots=(), remap_proxies=())
    real_start, real_uneven = remap_mod.all_to_all_start, remap_mod.all_to_all_uneven

    def refuse(*a: object, **kw: object) -> None:
        raise AssertionError("a remap collective ran for identical layouts")

    remap_mod.all_to_all_start, remap_mod.all_to_all_uneven = refuse, refuse  # type: ignore[assignment]
    try:
        check_attention(group, same, dtype=torch.float64, routing=True, hq=4, hkv=2, seed=1)
    finally:
        remap_mod.all_to_all_start, remap_mod.all_to_all_uneven = real_start, real_uneven


def check_linear_inputs_freed(group: ZeppelinGroup, plan: StepPlan) -> None:
    """The caller's linear q, k, v (non-leaf, as Megatron's RoPE outputs are) are not kept until backward:
    once the caller drops them, nothing holds them (in-place chunks read q/k/v in the attention buffers in
    backward), and backward still runs."""
    import gc
    import weakref
    q0, k0, v0, dout = _inputs(plan, group.rank, torch.float64, 4, 2)
    leaves = [x.clone().requires_grad_(True) for x in (q0, k0, v0)]
    q, k, v = (x * 1.0 for x in leaves)  # non-leaf tensors
    refs = [weakref.ref(x) for x in (q, k, v)]
    out = zeppelin_attention(q, k, v, plan, group, backend="reference")
    del q, k, v
    gc.collect()
    assert all(r() is None for r in refs), f"rank {group.rank}: the attention call keeps its linear q/k/v alive"
    out.backward(dout)
    assert all(x.grad is not None for x in leaves)


def run_in_place(rank: int, world: int, n_plans: int) -> None:
    for nodes, gpn in runtime_workers.topologies(world):
        group = ZeppelinGroup(process_group=None, gpus_per_node=gpn)
        for p_idx in range(n_plans):
            for routed in (False, True) if nodes >= 2 else (False,):
                windowed = window_plan(500 + 100 * world + 10 * nodes + p_idx, nodes, gpn, routed=routed)
                for plan in (windowed, windowed.evolve(remap_slots=())):  # in-place chunks: windowed has some
                    low = lower(plan)
                    assert plan is not windowed or any(c.linear_rows is not None for p in low.ranks
                                                       for c in p.local_chunks)
                    assert any(plan.remap.exchange(r, "to_attention").keep_src.size for r in range(world))
                    check_round_trip(group, plan)
                    for dtype, hq, hkv in ((torch.float64, 4, 4), (torch.float64, 4, 2), (torch.float32, 6, 2)):
                        check_attention(group, plan, dtype=dtype, routing=routed, hq=hq, hkv=hkv, seed=p_idx)
                    check_same_as_plain(group, plan, dtype=torch.float64, hq=4, hkv=2, routing=True)
                    check_same_as_plain(group, plan, dtype=torch.float32, hq=4, hkv=4, routing=False)
                    check_linear_inputs_freed(group, plan)
                check_no_remap(group, windowed)
        dist.barrier()
    if world == 4:  # plan_step plans: staying local sequences after the rings run in place
        from window_workers import planned
        group = ZeppelinGroup(process_group=None, gpus_per_node=2)
        for seed in (1, 5):
            plan = planned("2x2", seed)
            assert any(c.linear_rows is not None for p in lower(plan).ranks for c in p.local_chunks)
            check_round_trip(group, plan)
            check_attention(group, plan, dtype=torch.float64, routing=True, hq=4, hkv=2, seed=seed)
            check_same_as_plain(group, plan, dtype=torch.float64, hq=4, hkv=2, routing=True)
