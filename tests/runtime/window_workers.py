"""Checks in spawned gloo ranks for remap windows (``StepPlan.remap_slots``, ``runtime/overlap.py``).

Plans: :func:`window_plan` rebuilds a :mod:`plan_factory` plan's linear layout so that about half of
the local sequences *stay* (whole on their rank in the linear layout too), then puts staying
sequences into windows of the remap in and the remap out (taken out of ``local_slots``), direct or
routed (``remap_proxies``); :func:`planned_windows` does the same to a ``plan_step`` plan. Per plan:
the call order (post, window calls on linear rows, wait, engine, ...; :func:`check_window_order`),
outputs and dq/dk/dv against float64 per-sequence SDPA (``runtime_workers.check_attention``), and
bitwise the same results as the plan without its windows (:func:`check_same_without`).
"""

from __future__ import annotations

import functools
import random
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

import runtime_workers
from plan_factory import cut_in_order, random_plan, small_batch
from runtime_workers import check_attention, gather, global_data
from zeppelin_megatron.planner.lowering import LocalCall, RingCall, lower, lower_remaps
from zeppelin_megatron.planner.plan import LocalSlot, RemapSlot, StepPlan
from zeppelin_megatron.runtime import ZeppelinGroup, ZeppelinTimeoutError, zeppelin_attention
from zeppelin_megatron.runtime import remap as remap_mod
from zeppelin_megatron.runtime.engine import AttentionEngine
from zeppelin_megatron.runtime.kernels import get_kernel
from zeppelin_megatron.runtime.overlap import RemapWindows

DIRECTIONS = ("to_attention", "to_linear")


# -- plans ------------------------------------------------------------------------------------------


def staying(plan: StepPlan) -> dict[int, list[int]]:
    """Rank -> its local sequences that stay (one linear range ``(seq, 0, length)`` on the rank)."""
    out: dict[int, list[int]] = {}
    for i, s in enumerate(plan.sequences):
        if s.placement == "local" and (i, 0, s.length) in plan.linear_layout[s.ranks[0]]:
            out.setdefault(s.ranks[0], []).append(i)
    return out


def with_windows(plan: StepPlan, seed: int, *, every: bool = False) -> StepPlan:
    """``plan`` with staying local sequences in remap windows: per rank that has some, a random split
    into a ``to_attention`` window, a ``to_linear`` window and the rest (left where they were);
    ``every``: each rank with two or more staying sequences gets both windows, a rank with one a window
    of a random direction. The window sequences leave ``local_slots``. Raises ``AssertionError`` when no
    rank has a staying sequence."""
    rng = random.Random(seed)
    slots: list[RemapSlot] = []
    for r, seqs in sorted(staying(plan).items()):
        seqs = list(seqs)
        rng.shuffle(seqs)
        if every and len(seqs) >= 2:
            cut = rng.randint(1, len(seqs) - 1)
            parts = {"to_attention": seqs[:cut], "to_linear": seqs[cut:]}
        elif every:
            parts = {rng.choice(DIRECTIONS): seqs}
        else:
            a, b = sorted(rng.randint(0, len(seqs)) for _ in range(2))
            parts = {"to_attention": seqs[:a], "to_linear": seqs[a:b]}
        slots += [RemapSlot(rank=r, direction=d, seqs=tuple(sorted(x))) for d, x in parts.items() if x]
    assert slots, "no staying local sequence to put in a window"
    taken = {i for x in slots for i in x.seqs}
    local = tuple(y for y in (LocalSlot(x.rank, x.ring, x.step, tuple(i for i in x.seqs if i not in taken))
                              for x in plan.local_slots) if y.seqs)
    return replace(plan, local_slots=local, remap_slots=tuple(slots))


def window_plan(seed: int, nodes: int, gpn: int, *, routed: bool, max_len: int = 48) -> StepPlan:
    """A :func:`plan_factory.random_plan` (odd lengths, shuffled ranges, local slots) whose linear layout
    keeps about half of the local sequences whole on their own rank (the rest of the tokens cut at random
    over all ranks, ranges shuffled per rank), with windows in both directions (:func:`with_windows`);
    remap direct, or ``routed`` over a random set of proxies (``nodes >= 2``)."""
    rng = random.Random(1000 + seed)
    base = random_plan(seed, nodes, gpn, n_local=12, max_len=max_len)
    world = nodes * gpn
    seqs = base.sequences
    stay = [i for i, s in enumerate(seqs) if s.placement == "local" and rng.random() < 0.6]
    lin: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    for i in stay:
        lin[seqs[i].ranks[0]].append((i, 0, seqs[i].length))
    rest = [i for i in range(len(seqs)) if i not in set(stay)]
    rng.shuffle(rest)
    total = sum(seqs[i].length for i in rest)
    bounds = sorted(rng.randint(0, total) for _ in range(world - 1)) + [total]
    for r, ranges in enumerate(cut_in_order([s.length for s in seqs], rest, bounds, world)):
        lin[r] += ranges
    for ranges in lin:
        rng.shuffle(ranges)
    proxies: tuple[int, ...] = ()
    if routed:
        assert nodes >= 2, "a routed remap needs two nodes or more"
        proxies = tuple(sorted(rng.sample(range(gpn), rng.randint(1, gpn))))
    plan = replace(base, linear_layout=tuple(map(tuple, lin)), remap_proxies=proxies, linear=None)
    assert lower_remaps(plan) is not None, "the remap moves no row"
    return with_windows(plan, seed, every=True)


def planned(spec: str, seed: int) -> StepPlan:
    """A ``plan_step`` plan with a token-balanced linear layout (``remap=True``: the remap moves rows) of
    one long sequence, one medium and up to 12 short ones (96 tokens per GPU), rows in engine order."""
    from zeppelin_megatron.planner import CostModel, load_cluster, load_model, plan_step
    from zeppelin_megatron.planner.options import PlannerOptions

    cost = CostModel(model=load_model(None), cluster=load_cluster(spec, tokens_per_gpu=96))
    lens = small_batch(seed, cost.cluster.world_size)
    return plan_step(lens, cost, PlannerOptions(head_parallel=False, remap=True))


def planned_windows(spec: str, seed: int) -> StepPlan:
    """:func:`planned` with its staying local sequences in windows of both directions (whatever windows
    the planner chose replaced)."""
    return with_windows(planned(spec, seed), seed, every=True)


# -- checks -----------------------------------------------------------------------------------------


def _window_seqs(plan: StepPlan, rank: int) -> dict[str, tuple[int, ...]]:
    return {x.direction: x.seqs for x in plan.remap_slots if x.rank == rank}


def check_window_order(group: ZeppelinGroup, plan: StepPlan, *, routing: bool, hq: int = 4, hkv: int = 2,
                       d: int = 4) -> None:
    """Forward and backward run, per rank, exactly: post the remap in (routed: its phase 1), the
    ``to_attention`` window call, the wait (routed: then phases 2 and 3), the engine's kernel calls in
    program order, post the remap out, the ``to_linear`` window call, the wait. Each window call gets
    the q/k/v (backward: dout) rows of its sequences from the rank's linear buffers, and the results
    equal ``zeppelin_attention``'s (same Function)."""
    rank, cpu, dtype = group.rank, torch.device("cpu"), torch.float64
    data = global_data(plan, hq, hkv, d, seed=5)
    prog = lower(plan, routing=routing).ranks[rank]
    wins = _window_seqs(plan, rank)
    assert [w.direction for w in prog.windows] == [x for x in DIRECTIONS if x in wins], (rank, prog.windows)
    in_calls = {op.chunk for op in prog.forward + prog.backward if isinstance(op, LocalCall)}
    assert not in_calls & {w.chunk for w in prog.windows}, "a window chunk is also run by a LocalCall"
    lin = plan.linear_layout[rank]
    e = lambda h: torch.zeros(0, h, d, dtype=dtype)  # noqa: E731
    q, k, v, dout = (gather(lin, [x[i] for x in data], e(hkv if i in (1, 2) else hq)) for i in range(4))
    ref = get_kernel("reference", cpu, dtype)
    log: list[Any] = []
    q_store = q.untyped_storage().data_ptr()

    class Recording:
        name = "recording"

        def forward(self, q, k, v, batch, scale):  # type: ignore[no-untyped-def]
            view = q.untyped_storage().data_ptr() == q_store  # a view of the linear q (no copy)
            log.append(("kernel", batch.lens_q, batch.lens_k, batch.causal, q.clone(), k.clone(), v.clone(), view))
            return ref.forward(q, k, v, batch, scale)

        def backward(self, dout, q, k, v, out, lse, batch, scale):  # type: ignore[no-untyped-def]
            log.append(("kernel", batch.lens_q, batch.lens_k, batch.causal, dout.clone(), q.clone(), k.clone()))
            return ref.backward(dout, q, k, v, out, lse, batch, scale)

    real_start, real_uneven = remap_mod.all_to_all_start, remap_mod.all_to_all_uneven

    def start(*a: Any, what: str, **kw: Any) -> Any:
        log.append(("post", what))
        pending = real_start(*a, what=what, **kw)
        wait = pending.wait
        pending.wait = lambda: (log.append(("wait", what)), wait())[1]
        return pending

    def uneven(*a: Any, what: str, **kw: Any) -> Any:
        log.append(("post", what))
        got = real_uneven(*a, what=what, **kw)
        log.append(("wait", what))
        return got

    remap_mod.all_to_all_start, remap_mod.all_to_all_uneven = start, uneven  # type: ignore[assignment]
    try:
        eng = AttentionEngine(plan, group, kernel=Recording(), scale=0.3,  # type: ignore[arg-type]
                              routes=plan.routing if routing else (), hkv=hkv, head_dim=d, dtype=dtype, device=cpu,
                              hq=hq)
        run = RemapWindows(eng)
        out, saved = run.forward(q, k, v)
        fwd = list(log)
        log.clear()
        grads = run.backward(dout, saved)
        bwd = list(log)
    finally:
        remap_mod.all_to_all_start, remap_mod.all_to_all_uneven = real_start, real_uneven

    def rows(seqs: tuple[int, ...], i: int) -> torch.Tensor:
        return torch.cat([data[s][i] for s in seqs])

    def exchange(direction: str) -> list[Any]:
        if plan.remap_proxies and group.size > 1:
            names = [f"the routed remap {direction} (phase {n} of 3)" for n in (1, 2, 3)]
            return [("post", names[0]), ("window", direction), ("wait", names[0])] + [
                (x, n) for n in names[1:] for x in ("post", "wait")]
        name = f"the remap {direction}"
        return [("post", name), ("window", direction), ("wait", name)]

    what = f"rank {rank} plan {plan.nodes}x{plan.gpus_per_node} routing={routing} windows {wins}"
    for name, got, ops, backward in (("forward", fwd, prog.forward, False), ("backward", bwd, prog.backward, True)):
        want: list[Any] = exchange("to_attention")
        for op in ops:  # the engine's kernel calls, in program order
            if isinstance(op, RingCall):
                want.append(("kernel", op.lens_q, op.lens_k, op.causal))
            elif isinstance(op, LocalCall):
                c = prog.local_chunks[op.chunk]
                want.append(("kernel", c.lens, c.lens, True))
        want += exchange("to_linear")
        want = [x for x in want if x[0] != "window" or x[1] in wins]
        assert len(got) == len(want), f"{what}: {name} ran {len(got)} events, expected {len(want)}"
        for i, (ev, item) in enumerate(zip(got, want)):
            if item[0] in ("post", "wait"):
                assert ev == item, f"{what}: {name} event {i} is {ev[:4]}, expected {item}"
            elif item[0] == "kernel":
                assert ev[:4] == item, f"{what}: {name} event {i} is {ev[:4]}, expected {item}"
            else:
                seqs = wins[item[1]]
                lens = tuple(plan.sequences[s].length for s in seqs)
                assert ev[:4] == ("kernel", lens, lens, True), f"{what}: {name} event {i} is {ev[:4]}, expected {item}"
                if not backward:  # its q is a view of the linear q exactly when its rows are one range
                    w = next(w for w in prog.windows if w.direction == item[1])
                    one = all(b == c for (_, b), (c, _) in zip(w.linear_rows, w.linear_rows[1:]))
                    assert ev[7] == one, f"{what}: window {item[1]} q is a view: {ev[7]}, one range: {one}"
                for x, j in zip(ev[4:7], (3, 0, 1) if backward else (0, 1, 2)):  # dout, q, k / q, k, v
                    assert torch.equal(x, rows(seqs, j)), f"{what}: {name}: window {item[1]} read other rows"
    q_, k_, v_ = (t.clone().requires_grad_(True) for t in (q, k, v))
    o_ = zeppelin_attention(q_, k_, v_, plan, group, softmax_scale=0.3, routing=routing, backend="reference")
    o_.backward(dout)
    for nm, a, b in (("out", out, o_), ("dq", grads[0], q_.grad), ("dk", grads[1], k_.grad),
                     ("dv", grads[2], v_.grad)):
        assert torch.equal(a, b.detach()), f"{what}: {nm} of RemapWindows differs from zeppelin_attention's"


def _results(group: ZeppelinGroup, plan: StepPlan, dtype: torch.dtype, hq: int, hkv: int,
             routing: bool, packed: bool = False) -> list[torch.Tensor]:
    """out, dq, dk, dv of ``zeppelin_attention``; ``packed``: q, k, v are non-contiguous views of one
    [T, Hq + 2 Hkv, D] leaf (as Megatron splits its fused QKV projection)."""
    d, rank = 8, group.rank
    data = global_data(plan, hq, hkv, d, seed=9)
    lin = plan.linear_layout[rank]
    e = lambda h: torch.zeros(0, h, d, dtype=torch.float64)  # noqa: E731
    q, k, v = (gather(lin, [x[i] for x in data], e(hkv if i in (1, 2) else hq)).to(dtype) for i in range(3))
    dout = gather(lin, [x[3] for x in data], e(hq)).to(dtype)
    if packed:
        leaf = torch.cat([q, k, v], dim=1).requires_grad_(True)
        q, k, v = leaf[:, :hq], leaf[:, hq:hq + hkv], leaf[:, hq + hkv:]
        assert not q.is_contiguous() or q.shape[0] <= 1
        out = zeppelin_attention(q, k, v, plan, group, softmax_scale=0.4, routing=routing, backend="reference")
        out.backward(dout)
        assert leaf.grad is not None
        return [out.detach(), leaf.grad[:, :hq], leaf.grad[:, hq:hq + hkv], leaf.grad[:, hq + hkv:]]
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = zeppelin_attention(q, k, v, plan, group, softmax_scale=0.4, routing=routing, backend="reference")
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def check_same_without(group: ZeppelinGroup, plan: StepPlan, *, dtype: torch.dtype, hq: int, hkv: int,
                       routing: bool) -> None:
    """The plan with its windows, its q, k, v non-contiguous views of one fused tensor, gives bitwise the
    results of the same plan without them (the window sequences then run after the rings, in the engine,
    on attention rows) from contiguous q, k, v."""
    plain = plan.evolve(remap_slots=())
    assert not any(p.windows for p in lower(plain).ranks)
    with_w = _results(group, plan, dtype, hq, hkv, routing, packed=True)
    without = _results(group, plain, dtype, hq, hkv, routing)
    for nm, a, b in zip(("out", "dq", "dk", "dv"), with_w, without):
        assert torch.equal(a, b), f"rank {group.rank} {dtype} Hq={hq} Hkv={hkv}: {nm} differs with and without windows"


CASES = [(torch.float64, True, 4, 4), (torch.float64, False, 4, 2), (torch.float32, True, 6, 2),
         (torch.float32, False, 4, 1)]


def check_plan(group: ZeppelinGroup, plan: StepPlan, p_idx: int) -> None:
    """Order (routing on and off), exactness against SDPA (MHA and GQA, float64 and float32), and the same
    results without the windows."""
    assert plan.remap_slots and {x.direction for x in plan.remap_slots} == set(DIRECTIONS), plan.remap_slots
    for routing in (True, False):
        check_window_order(group, plan, routing=routing)
    for dtype, routing, hq, hkv in CASES:
        check_attention(group, plan, dtype=dtype, routing=routing, hq=hq, hkv=hkv, seed=p_idx)
    check_same_without(group, plan, dtype=torch.float64, hq=4, hkv=2, routing=True)
    check_same_without(group, plan, dtype=torch.float32, hq=4, hkv=4, routing=False)


def run_windows(rank: int, world: int, n_plans: int, seed0: int = 0) -> None:
    """Every check on ``n_plans`` window plans per topology of ``world`` (``runtime_workers.topologies``),
    direct and (two nodes or more) routed remaps; on 4 ranks also ``plan_step`` plans."""
    for nodes, gpn in runtime_workers.topologies(world):
        group = ZeppelinGroup(process_group=None, gpus_per_node=gpn)
        for p_idx in range(n_plans):
            for routed in (False, True) if nodes >= 2 else (False,):
                plan = window_plan(seed0 + 100 * world + 10 * nodes + p_idx, nodes, gpn, routed=routed)
                assert bool(plan.remap_proxies) == routed
                check_plan(group, plan, p_idx)
        dist.barrier()
    if world == 4:
        group = ZeppelinGroup(process_group=None, gpus_per_node=2)
        for seed in (1, 5):  # two intra-node rings, direct remap; rings of 4 and 2, remap routed
            plan = planned_windows("2x2", seed)
            check_plan(group, plan, seed)


# -- a failed peer ------------------------------------------------------------------------------------


def run_window_timeouts(rank: int, world: int, timeout_s: float) -> None:
    """On 2 ranks, rank 1 fails before the call and stays alive; rank 0, in a window plan with the check
    off, posts the remap, runs its window call and waits: ZeppelinTimeoutError naming the remap and rank 1
    within the timeout (direct 1x2, routed 2x1)."""
    from agreement_workers import _timed
    from zeppelin_megatron.megatron.groups import zeppelin_group_over

    assert world == 2
    for nodes, gpn, routed in ((1, 2, False), (2, 1, True)):
        plan = window_plan(7, nodes, gpn, routed=routed)
        if 0 not in {x.rank for x in plan.remap_slots if x.direction == "to_attention"}:
            plan = _window_on(plan, 0)
        group = zeppelin_group_over([(0, 1)], gpn, timeout_s)
        if rank == 0:
            n = plan.tokens(0, "linear")
            q, k = torch.randn(n, 4, 8, dtype=torch.float64), torch.randn(n, 2, 8, dtype=torch.float64)
            name = "the routed remap to_attention (phase 1 of 3)" if routed else "the remap to_attention"
            call = functools.partial(zeppelin_attention, q, k, k, plan, group, check_plan=False)
            _timed(ZeppelinTimeoutError, [f"timed out after {timeout_s:g} s", name,
                                          f"waiting for {group.describe_ranks([1])}"], call, timeout_s * 2 + 5)
        dist.barrier()


def _window_on(plan: StepPlan, rank: int) -> StepPlan:
    """``plan`` with a ``to_attention`` window on ``rank`` (one of its staying sequences)."""
    seqs = staying(plan).get(rank, [])
    assert seqs, f"rank {rank} has no staying local sequence"
    keep = [x for x in plan.remap_slots if x.rank != rank]
    local = (LocalSlot(x.rank, x.ring, x.step, tuple(i for i in x.seqs if i != seqs[0])) for x in plan.local_slots)
    return replace(plan, remap_slots=tuple(keep) + (RemapSlot(rank=rank, direction="to_attention", seqs=(seqs[0],)),),
                   local_slots=tuple(y for y in local if y.seqs))
