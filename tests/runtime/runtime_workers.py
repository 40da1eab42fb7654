"""Checks that run inside spawned gloo ranks (module-level so spawn can pickle them)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from plan_factory import placements, random_plan
from zeppelin_megatron.planner.plan import LocalSlot, StepPlan
from zeppelin_megatron.planner.routing import Route
from zeppelin_megatron.runtime import (
    PlanMismatchError,
    RuntimeInputError,
    ZeppelinGroup,
    to_attention,
    to_linear,
    zeppelin_attention,
)
from zeppelin_megatron.planner.head_parallel import lane_heads
from zeppelin_megatron.planner.lowering import LocalCall, Message, Post, RingCall, Wait, lower, message_hops
from zeppelin_megatron.planner.lowering_parts import row_span
from zeppelin_megatron.runtime.comm import CommStream, all_to_all_uneven
from zeppelin_megatron.runtime.router import Router, rank_rounds


# -- data -------------------------------------------------------------------------------


def global_data(plan: StepPlan, hq: int, hkv: int, d: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """Per sequence (q [L,Hq,D], k, v [L,Hkv,D], dout [L,Hq,D]) in float64, identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(s.length, hq, d, generator=g, dtype=torch.float64),
         torch.randn(s.length, hkv, d, generator=g, dtype=torch.float64),
         torch.randn(s.length, hkv, d, generator=g, dtype=torch.float64),
         torch.randn(s.length, hq, d, generator=g, dtype=torch.float64))
        for s in plan.sequences
    ]


def gather(ranges: Sequence[tuple[int, int, int]], per_seq: list[torch.Tensor], empty: torch.Tensor) -> torch.Tensor:
    parts = [per_seq[s][a:b] for s, a, b in ranges]
    return torch.cat(parts) if parts else empty


def reference(data: list[tuple[torch.Tensor, ...]], scale: float) -> list[tuple[torch.Tensor, ...]]:
    """Per-sequence causal SDPA in float64: (out, dq, dk, dv)."""
    res = []
    for q, k, v, do in data:
        q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        ).transpose(0, 1)
        out.backward(do)
        res.append((out.detach(), q.grad, k.grad, v.grad))
    return res


def rel_err(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    """Max abs error relative to ``scale``, the reference's max magnitude over the whole batch
    (a rank's own slice can be ~0, e.g. dq of a sequence's first token)."""
    if b.numel() == 0:
        return 0.0
    return float((a.double() - b).abs().max() / scale)


# -- checks -----------------------------------------------------------------------------


def check_attention(group: ZeppelinGroup, plan: StepPlan, *, dtype: torch.dtype, routing: bool, hq: int,
                    hkv: int, d: int = 8, seed: int = 0, device: str = "cpu", backend: str | None = "reference",
                    tol: float | None = None) -> None:
    """``zeppelin_attention`` on this rank's linear rows (on ``device``, kernel ``backend``; ``None``: the device's
    default) against per-sequence causal SDPA in float64: outputs and dq/dk/dv within ``tol`` of the batch's
    largest reference value (default 1e-9 in float64, else 1e-5)."""
    rank = group.rank
    data = global_data(plan, hq, hkv, d, seed)
    scale = 0.7 / d ** 0.5
    ref = reference(data, scale)
    lin = plan.linear_layout[rank]
    e = lambda h: torch.zeros(0, h, d, dtype=torch.float64)  # noqa: E731
    q = gather(lin, [x[0] for x in data], e(hq)).to(device, dtype).requires_grad_(True)
    k = gather(lin, [x[1] for x in data], e(hkv)).to(device, dtype).requires_grad_(True)
    v = gather(lin, [x[2] for x in data], e(hkv)).to(device, dtype).requires_grad_(True)
    dout = gather(lin, [x[3] for x in data], e(hq)).to(device, dtype)
    out = zeppelin_attention(q, k, v, plan, group, softmax_scale=scale, routing=routing, backend=backend)
    out.backward(dout)
    if tol is None:
        tol = 1e-9 if dtype == torch.float64 else 1e-5
    what = (f"rank {rank} plan {plan.nodes}x{plan.gpus_per_node} {device} {dtype} routing={routing} Hq={hq} "
            f"Hkv={hkv}")
    assert out.shape == q.shape and out.dtype == dtype and out.device.type == torch.device(device).type, what
    for name, got, idx in (("out", out, 0), ("dq", q.grad, 1), ("dk", k.grad, 2), ("dv", v.grad, 3)):
        assert got is not None and got.dtype == dtype and got.device.type == out.device.type, f"{what}: {name}"
        want = gather(lin, [r[idx] for r in ref], e(got.shape[1]))
        err = rel_err(got.detach().cpu(), want, max(float(r[idx].abs().max()) for r in ref))
        assert err <= tol, f"{what}: {name} relative error {err:.3e} > {tol:g}"


def check_remap(group: ZeppelinGroup, plan: StepPlan) -> None:
    rank = group.rank
    vals = [torch.arange(s.length, dtype=torch.float64)[:, None] + 1000.0 * i for i, s in enumerate(plan.sequences)]
    empty = torch.zeros(0, 1, dtype=torch.float64)
    x = gather(plan.linear_layout[rank], vals, empty).requires_grad_(True)
    a = to_attention(x, plan, group)
    want_a = gather(plan.attention_layout[rank], vals, empty)
    assert torch.equal(a.detach(), want_a), f"rank {rank}: attention-layout buffer is wrong"
    y = to_linear(a, plan, group)
    assert torch.equal(y.detach(), x.detach()), f"rank {rank}: linear -> attention -> linear is not the identity"
    g = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    y.backward(g)
    assert torch.equal(x.grad, g), f"rank {rank}: the remap round trip's gradient is not the identity"


def _payload(msg_idx: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.float64).to(dtype) + 1e6 * (msg_idx + 1)


def check_router(group: ZeppelinGroup, messages: Sequence[Message], unit: int = 1,
                 dtype: torch.dtype = torch.float64, into: bool = False) -> None:
    """Every message (``tokens * unit`` elements, direct or over its route) arrives intact; with
    ``into``, every other message this rank receives lands in its slice of one given buffer."""
    rank = group.rank
    router = Router(group, stream=CommStream(torch.device("cpu")))
    sizes = tuple(m.tokens * unit for m in messages)
    hops = message_hops(tuple(messages), sizes, group.gpus_per_node)
    payloads = {i: _payload(i, sizes[i], dtype) for i, m in enumerate(messages) if m.src == rank}
    mine = [i for i, m in enumerate(messages) if m.dst == rank]
    buf = torch.full((sum(sizes[i] for i in mine),), -1.0, dtype=dtype)
    offsets = [sum(sizes[j] for j in mine[:x]) for x in range(len(mine))]
    given = {i: buf[o:o + sizes[i]] for x, (i, o) in enumerate(zip(mine, offsets)) if into and x % 2 == 0}
    got = router.start(rank_rounds(hops, rank), [(m.src, m.dst) for m in messages], sizes, payloads,
                       dtype=dtype, device=torch.device("cpu"), into=given).wait()
    assert set(got) == set(mine), f"rank {rank}: received messages {sorted(got)}, expected {sorted(mine)}"
    for i in mine:
        assert torch.equal(got[i], _payload(i, sizes[i], dtype)), f"rank {rank}: message {i} corrupted"
        if i in given:
            assert got[i] is given[i], f"rank {rank}: message {i} did not land in the given buffer"


def random_router_case(seed: int, group: ZeppelinGroup) -> list[Message]:
    rng = random.Random(seed)
    world, gpn = group.size, group.gpus_per_node
    messages: list[Message] = []
    routed: set[tuple[int, int]] = set()
    for _ in range(rng.randint(1, 2 * world)):
        src, dst = rng.sample(range(world), 2)
        route = None
        if group.node_of(src) != group.node_of(dst) and (src, dst) not in routed and rng.random() < 0.8:
            others = [l for l in range(gpn) if l != group.local_of(src)]
            extra = rng.sample(others, rng.randint(0, len(others)))
            route = Route((src, dst), src, dst, (group.local_of(src), *extra))
            routed.add((src, dst))
        messages.append(Message(src=src, dst=dst, tokens=rng.randint(0, 40), route=route))
    return messages


def expect_error(exc_type: type[BaseException], fragment: str, fn) -> str:  # type: ignore[no-untyped-def]
    try:
        fn()
    except exc_type as exc:
        assert fragment in str(exc), f"error {str(exc)!r} does not mention {fragment!r}"
        return str(exc)
    raise AssertionError(f"expected {exc_type.__name__} mentioning {fragment!r}")


def check_errors(group: ZeppelinGroup, plan: StepPlan, other_plan: StepPlan) -> None:
    rank = group.rank
    n = plan.tokens(rank, "linear")
    q = torch.randn(n, 4, 8, dtype=torch.float64)
    k = torch.randn(n, 2, 8, dtype=torch.float64)
    # plans that differ between ranks: every rank raises
    mine = plan if rank % 2 == 0 else other_plan
    expect_error(PlanMismatchError, "different step plans", lambda: zeppelin_attention(q, k, k, mine, group))
    # wrong token count on one rank only: that rank names the numbers, the others raise too
    bad = torch.randn(n + 1, 4, 8, dtype=torch.float64) if rank == 0 else q
    bad_k = torch.randn(n + 1, 2, 8, dtype=torch.float64) if rank == 0 else k
    msg = expect_error(RuntimeInputError, "", lambda: zeppelin_attention(bad, bad_k, bad_k, plan, group))
    if rank == 0:
        assert f"{n + 1} tokens" in msg and f"{n} tokens" in msg, msg
    else:
        assert "another rank" in msg or "rejected its inputs" in msg, msg
    expect_error(RuntimeInputError, "Hq=4", lambda: zeppelin_attention(q, q[:, :3], q[:, :3], plan, group))
    expect_error(RuntimeInputError, "torch.float32",
                 lambda: zeppelin_attention(q, k.float(), k, plan, group))
    expect_error(RuntimeInputError, "meta", lambda: zeppelin_attention(q, k.to("meta"), k, plan, group))
    # with the check off, local errors are raised locally (all ranks are bad here)
    expect_error(RuntimeInputError, "Hkv=3",
                 lambda: zeppelin_attention(q, q[:, :3], q[:, :3], plan, group, check_plan=False))
    # a plan for another group size
    small = random_plan(1, 1, 1) if group.size > 1 else random_plan(1, 1, 2)
    expect_error(RuntimeInputError, f"= {small.world_size} ranks",
                 lambda: zeppelin_attention(q, k, k, small, group))
    # a good call still works after all the failures (nothing left hanging)
    out = zeppelin_attention(q, k, k, plan, group, backend="reference")
    assert out.shape == q.shape


def _unit(kind: str, backward: bool, a2a: int, hq: int, hkv: int, d: int) -> int:
    """Elements per token row of a transfer, from what it carries: K/V (or dK/dV) of the lane's K/V
    heads; forward ``heads`` q, k, v and backward ``tokens`` dq, dk, dv of a lane's heads; forward
    ``tokens`` out and backward ``heads`` dout of a lane's query heads."""
    kv = hkv if a2a == 1 else (hkv // a2a if hkv % a2a == 0 else 1)
    q = hq // a2a
    if kind in ("kv", "acc"):
        return 2 * kv * d
    return q * d if (kind == "heads") == backward else (q + 2 * kv) * d


def _lowered_events(plan: StepPlan, rank: int, ops: Sequence[object], prog: object, heads: tuple[int, int, int],
                    data: list[tuple[torch.Tensor, ...]], backward: bool) -> list[tuple[object, ...]]:
    """What executing ``ops`` must do on gloo, derived from the lowered program alone: per kernel
    call ``(lens_q, lens_k, causal, q, k, v)`` with q/k/v the float64 rows of its token ranges (a
    head-parallel ring's calls: its lane's heads only); per ``Post`` the rank's round-0 hops, per
    ``Wait`` ``("wait",)`` and its round-1 and round-2 hops (gloo posts later rounds while waiting), as ``(peer,
    send, tag, elements, dtype)``, ``heads = (hq, hkv, d)`` giving each transfer's elements per token;
    dK/dV accumulators, and the backward ``tokens`` exchange (dq, dk, dv) of a ring of several blocks whose lanes
    share K/V heads (``Hkv % a != 0``: summed at home), travel in float32 for half-precision inputs, everything
    else (the other rings' dq, dk, dv too: cast once before sending, or one kernel call's, nothing accumulated) in
    the inputs' dtype."""
    hq, hkv, d = heads
    dtype = data[0][0].dtype if data else torch.float64
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def rows(ranges: Sequence[tuple[int, int, int]], i: int, cols: tuple[int, int] | None = None) -> torch.Tensor:
        x = torch.cat([data[s][i][a:b] for s, a, b in ranges])
        return x if cols is None else x[:, cols[0]:cols[1]]

    a2a = {p.ring: p.a2a for p in prog.rings}  # type: ignore[attr-defined]
    blocks = {p.ring: p.size for p in prog.rings}  # type: ignore[attr-defined]
    ev: list[tuple[object, ...]] = []
    for op in ops:
        if isinstance(op, RingCall):
            qc = kc = None
            if op.part.a2a > 1:
                assert op.part.lane is not None
                qc, kc = lane_heads(hq, hkv, op.part.a2a, op.part.lane)
            ev.append(("kernel", op.lens_q, op.lens_k, op.causal, rows(op.q, 0, qc), rows(op.kv, 1, kc),
                       rows(op.kv, 2, kc)))
        elif isinstance(op, LocalCall):
            c = prog.local_chunks[op.chunk]  # type: ignore[attr-defined]
            ranges = [(s, 0, n) for s, n in zip(c.seqs, c.lens)]
            ev.append(("kernel", c.lens, c.lens, True, rows(ranges, 0), rows(ranges, 1), rows(ranges, 2)))
        else:
            assert isinstance(op, (Post, Wait))
            tid = op.transfer
            hops = prog.transfers[tid].hops(_unit(tid.kind, backward, a2a[tid.ring], hq, hkv, d))  # type: ignore[attr-defined]
            shared = tid.kind == "tokens" and hkv % a2a[tid.ring] != 0  # lanes share K/V heads: summed at home
            wire = acc if tid.kind == "acc" or (shared and backward and blocks[tid.ring] > 1) else dtype
            if isinstance(op, Wait):
                ev.append(("wait",))
            for r in ((0,) if isinstance(op, Post) else (1, 2)):
                ev += [("p2p", h.receiver if h.sender == rank else h.sender, h.sender == rank, h.tag, h.count, wire)
                       for h in hops if h.round == r and rank in (h.sender, h.receiver)]
    return ev


def check_trace(group: ZeppelinGroup, plan: StepPlan, *, routing: bool, hq: int = 4, hkv: int = 2,
                d: int = 4, dtype: torch.dtype = torch.float64) -> None:
    """The engine executes the lowered program op for op, forward and backward: each kernel call
    (lengths, mask, and the exact token rows of q, k and v it is given) and each point-to-point
    op (peer, send/receive, tag, element count, dtype: accumulators in the accumulation dtype) and wait,
    in order, recorded at the kernel, at :func:`~zeppelin_megatron.runtime.comm.post` and ``InFlight.wait``.
    And a view is not a gather: each kernel call's q shares the engine input's storage exactly when its rows
    are one contiguous range read whole (a local chunk, or a plain ring's call over all of the rank's ring
    rows, with :func:`~zeppelin_megatron.planner.lowering_parts.row_span` of its rows not None)."""
    import zeppelin_megatron.runtime.router as router_mod
    from zeppelin_megatron.runtime.engine import AttentionEngine
    from zeppelin_megatron.runtime.kernels import get_kernel

    rank, cpu = group.rank, torch.device("cpu")
    data = [tuple(t.to(dtype) for t in x) for x in global_data(plan, hq, hkv, d, seed=11)]
    prog = lower(plan, routing=routing).ranks[rank]
    att = plan.attention_layout[rank]
    e = lambda h: torch.zeros(0, h, d, dtype=dtype)  # noqa: E731
    q, k, v, dout = (gather(att, [x[i] for x in data], e(hkv if i in (1, 2) else hq)) for i in range(4))
    ref = get_kernel("reference", cpu, dtype)
    log: list[tuple[object, ...]] = []
    views: list[bool] = []  # per kernel call: its q is a view of the engine's input q (no gather)
    q_store = q.untyped_storage().data_ptr()

    class Recording:
        name = "recording"

        def forward(self, q, k, v, batch, scale):  # type: ignore[no-untyped-def]
            log.append(("kernel", batch.lens_q, batch.lens_k, batch.causal, q.clone(), k.clone(), v.clone()))
            views.append(q.untyped_storage().data_ptr() == q_store)
            return ref.forward(q, k, v, batch, scale)

        def backward(self, dout, q, k, v, out, lse, batch, scale):  # type: ignore[no-untyped-def]
            log.append(("kernel", batch.lens_q, batch.lens_k, batch.causal, q.clone(), k.clone(), v.clone()))
            views.append(q.untyped_storage().data_ptr() == q_store)
            return ref.backward(dout, q, k, v, out, lse, batch, scale)

    real_post = router_mod.post

    def recording_post(ops, grp, *rest):  # type: ignore[no-untyped-def]
        log.extend(("p2p", op.peer, op.send, op.tag, op.tensor.numel(), op.tensor.dtype) for op in ops)
        return real_post(ops, grp, *rest)

    router_mod.post = recording_post
    try:
        eng = AttentionEngine(plan, group, kernel=Recording(), scale=0.3, routes=plan.routing if routing else (),  # type: ignore[arg-type]
                              hkv=hkv, head_dim=d, dtype=dtype, device=cpu, hq=hq)
        start = eng.router.start

        def recording_start(*a, **kw):  # type: ignore[no-untyped-def]
            flight = start(*a, **kw)
            wait, flight.wait = flight.wait, lambda: (log.append(("wait",)), wait())[1]
            return flight
        eng.router.start = recording_start  # type: ignore[method-assign]
        _, saved = eng.forward(q, k, v)
        fwd = list(log)
        log.clear()
        eng.backward(dout, q, k, v, saved)
        bwd = list(log)
    finally:
        router_mod.post = real_post
    what = f"rank {rank} plan {plan.nodes}x{plan.gpus_per_node} routing={routing} Hq={hq} Hkv={hkv} {dtype}"
    for name, got, ops in (("forward", fwd, prog.forward), ("backward", bwd, prog.backward)):
        want = _lowered_events(plan, rank, ops, prog, (hq, hkv, d), data, name == "backward")
        assert len(got) == len(want), f"{what}: {name} executed {len(got)} events, lowered {len(want)}"
        for i, (a, b) in enumerate(zip(got, want)):
            if a[0] == "p2p":
                assert a == b, f"{what}: {name} event {i} is {a}, the lowered program says {b}"
                continue
            same = a[:4] == b[:4] and all(torch.equal(x, y) for x, y in zip(a[4:], b[4:]))
            rows = " (the same call, other q/k/v rows)" if a[:4] == b[:4] else ""
            assert same, f"{what}: {name} event {i} is {a[:4]}, the lowered program says {b[:4]}{rows}"
    calls = any(isinstance(op, (RingCall, LocalCall)) for op in prog.forward)  # a relay may have none
    assert any(x[0] == "kernel" for x in fwd) == calls, what
    want_views = [_reads_a_view(op, prog) for ops in (prog.forward, prog.backward) for op in ops
                  if isinstance(op, (RingCall, LocalCall))]
    assert views == want_views, f"{what}: kernel q is a view {views}, contiguous rows say {want_views}"


def _reads_a_view(op: object, prog: object) -> bool:
    """Whether the engine hands kernel call ``op`` its q rows as a view of its input (module ``check_trace``)."""
    if isinstance(op, LocalCall):
        return row_span(prog.local_chunks[op.chunk].rows) is not None  # type: ignore[attr-defined]
    assert isinstance(op, RingCall)
    return op.part.a2a == 1 and op.q_all and row_span(op.part.rows) is not None


def _interleave_expected(rings: Sequence[tuple[int, tuple[tuple[int, int], ...]]],
                         chunks: Sequence[tuple[int, ...]], backward: bool) -> list[object]:
    """The engine's documented event order for rings ``(size, fills)``: chunk ``c`` of a fill
    ``(j, c)`` runs after step ``j``'s kernel (backward: and step ``j``'s dK/dV post), before
    step ``j``'s K/V wait; chunks in no fill run after the rings, in order."""
    ev: list[object] = []
    placed = {c for _, fills in rings for _, c in fills}
    for g, fills in rings:
        for j in range(g):
            ev += ["post"] * (j < g - 1) + ["ring"]
            if backward:
                ev += ["wait"] * (j > 0) + ["post"]
            ev += [chunks[c] for step, c in fills if step == j]
            ev += ["wait"] * (j < g - 1)
        ev += ["wait"] * backward  # own dK/dV accumulator home
    return ev + [c for i, c in enumerate(chunks) if i not in placed]


def check_local_interleaving(rank: int) -> None:
    """Local chunks run in the plan's slots (after the step's compute, before its wait, at any
    step), the rest after the rings; results are bitwise those of one call over all local sequences."""
    from zeppelin_megatron.planner import CostModel, ModelShape, load_cluster
    from zeppelin_megatron.runtime.engine import AttentionEngine
    from zeppelin_megatron.runtime.kernels import get_kernel
    from zeppelin_megatron.sim.planbuild import build_plan

    cpu = torch.device("cpu")
    cluster = load_cluster("2x2", tokens_per_gpu=256)
    cost = CostModel(model=ModelShape(layers=1, hidden=32, q_heads=4, kv_heads=2, ffn=64, head_dim=8),
                     cluster=cluster)
    # Rings in queue order (3, 0), (3, 0, 2, 1), (0, 1). Slots: rank 0 runs sequence 5 (2 tokens) in
    # ring 0 step 0 and sequences 3, 6 (9, 7) in ring 1 step 2, sequence 7 (3) after the rings;
    # rank 1 sequence 4 (5) in ring 2 step 0; rank 2 sequence 8 (4) in ring 1 step 1; rank 3 has no
    # slot: sequence 9 (6) after the rings.
    plan = build_plan([90, 61, 40, 9, 5, 2, 7, 3, 4, 6],
                      [(3, 0, 2, 1), (3, 0), (0, 1), (0,), (1,), (0,), (0,), (0,), (2,), (3,)], cluster, cost,
                      local_slots=False)
    assert [r.ranks for r in plan.rings] == [(3, 0), (3, 0, 2, 1), (0, 1)]
    plan = replace(plan, local_slots=(LocalSlot(0, 0, 0, (5,)), LocalSlot(0, 1, 2, (3, 6)), LocalSlot(1, 2, 0, (4,)),
                                      LocalSlot(2, 1, 1, (8,))))
    group = ZeppelinGroup(process_group=None, gpus_per_node=2)
    ref_kernel = get_kernel("reference", cpu, torch.float64)
    log: list[object] = []

    class Recording:
        name = "recording"

        def forward(self, q, k, v, batch, scale):  # type: ignore[no-untyped-def]
            log.append(batch)
            return ref_kernel.forward(q, k, v, batch, scale)

        def backward(self, dout, q, k, v, out, lse, batch, scale):  # type: ignore[no-untyped-def]
            log.append(batch)
            return ref_kernel.backward(dout, q, k, v, out, lse, batch, scale)

    def engine(p: StepPlan = plan) -> AttentionEngine:
        e = AttentionEngine(p, group, kernel=Recording(), scale=0.3, routes=(), hkv=2, head_dim=8,
                            dtype=torch.float64, device=cpu, hq=4)
        start = e.router.start

        def logged_start(*a, **kw):  # type: ignore[no-untyped-def]
            t = start(*a, **kw)
            log.append("post")
            wait = t.wait

            def logged_wait():  # type: ignore[no-untyped-def]
                log.append("wait")
                return wait()
            t.wait = logged_wait
            return t
        e.router.start = logged_start  # type: ignore[method-assign]
        return e

    n = plan.tokens(rank, "attention")
    gen = torch.Generator().manual_seed(rank)
    q, dout = (torch.randn(n, 4, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(n, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    eng = engine()
    prog = eng.program
    chunks = [c.lens for c in prog.local_chunks]
    assert chunks == {0: [(2,), (9, 7), (3,)], 1: [(5,)], 2: [(4,)], 3: [(6,)]}[rank], (rank, chunks)
    rings = [(t.size, tuple((op.step, op.chunk) for op in prog.forward if isinstance(op, LocalCall)
                            and op.ring == t.ring)) for t in prog.rings]
    assert rings == {0: [(2, ((0, 0),)), (4, ((2, 1),)), (2, ())], 1: [(4, ()), (2, ((0, 0),))],
                     2: [(4, ((1, 0),))], 3: [(2, ()), (4, ())]}[rank], (rank, rings)

    def events() -> list[object]:
        locals_ = {id(b): b.lens_q for _, b in eng.dev.local}
        out = [e if isinstance(e, str) else locals_.get(id(e), "ring") for e in log]
        log.clear()
        return out

    out, saved = eng.forward(q, k, v)
    fwd = events()
    grads = eng.backward(dout, q, k, v, saved)
    bwd = events()
    if rank == 0:  # spelled out once: each slot's call between its step's kernel and that step's wait
        assert fwd == ["post", "ring", (2,), "wait", "ring",
                       "post", "ring", "wait", "post", "ring", "wait", "post", "ring", (9, 7), "wait", "ring",
                       "post", "ring", "wait", "ring", (3,)], fwd
    if rank == 3:  # no slot: local after the rings
        assert fwd[-1] == (6,) and fwd.count((6,)) == 1, fwd
    assert fwd == _interleave_expected(rings, chunks, False), (rank, fwd)
    assert bwd == _interleave_expected(rings, chunks, True), (rank, bwd)
    dist.barrier()

    # Same engine with all local sequences as one call (the engine's former local queue): identical bits.
    whole = engine(replace(plan, local_slots=()))
    assert [c.lens for c in whole.program.local_chunks] == ([prog.local_lens] if prog.local_lens else [])
    assert [c.lens for c in whole.program.local_chunks] == {0: [(9, 2, 7, 3)], 1: [(5,)], 2: [(4,)], 3: [(6,)]}[rank]
    out1, saved1 = whole.forward(q, k, v)
    grads1 = whole.backward(dout, q, k, v, saved1)
    log.clear()
    for name, a, b in (("out", out, out1), ("dq", grads[0], grads1[0]), ("dk", grads[1], grads1[1]),
                       ("dv", grads[2], grads1[2])):
        assert torch.equal(a, b), f"rank {rank}: {name} differs between chunked and whole local calls"
    dist.barrier()


# -- per-world entry points -------------------------------------------------------------------


def topologies(world: int) -> list[tuple[int, int]]:
    return {1: [(1, 1)], 2: [(1, 2), (2, 1)], 4: [(2, 2)], 6: [(2, 3), (3, 2)], 8: [(2, 4), (4, 2)]}[world]


def run_all(rank: int, world: int, n_plans: int, full: bool, seed0: int = 0, heads: int = 0,
            heads_full: bool = False) -> None:
    """Every check on random plans (``n_plans`` per topology), then ``heads`` plans per topology with
    head-parallel rings (:func:`heads_workers.run_heads`, every head case when ``heads_full``)."""
    seen: set[str] = set()
    for nodes, gpn in topologies(world):
        group = ZeppelinGroup(process_group=None, gpus_per_node=gpn)
        for p_idx in range(n_plans):
            plan = random_plan(seed0 + 100 * world + 10 * nodes + p_idx, nodes, gpn)
            seen |= placements(plan)
            check_remap(group, plan)
            for t in lower(plan).transfers.values():  # every ring step's messages, routed and direct
                if t.id.step < 3:
                    check_router(group, t.messages, unit=3)
            check_router(group, random_router_case(7 * p_idx + world, group))
            check_trace(group, plan, routing=True)
            check_trace(group, plan, routing=False)
            cases = [(torch.float64, True, 4, 4), (torch.float64, False, 4, 2), (torch.float32, True, 4, 1),
                     (torch.float32, False, 4, 4)]
            if full:
                cases += [(torch.float64, True, 6, 2), (torch.float64, False, 4, 1), (torch.float32, True, 4, 2),
                          (torch.float32, False, 6, 3)]
            for dtype, routing, hq, hkv in cases:
                check_attention(group, plan, dtype=dtype, routing=routing, hq=hq, hkv=hkv, seed=p_idx)
        check_errors(group, random_plan(5, nodes, gpn), random_plan(6, nodes, gpn))
    if world == 4:
        check_local_interleaving(rank)
        # a launcher that numbers ranks node-interleaved: Zeppelin rank z is process rank rank_map[z]
        group = ZeppelinGroup(process_group=None, gpus_per_node=2, rank_map=(0, 2, 1, 3))
        plan = random_plan(4242, 2, 2)
        check_remap(group, plan)
        check_attention(group, plan, dtype=torch.float64, routing=True, hq=4, hkv=2)
        sub = dist.new_group([0, 1])
        if rank < 2:  # a sub-group: process-group ranks differ from global ranks for nobody here,
            g2 = ZeppelinGroup(process_group=sub, gpus_per_node=1)  # but the conversion path is used
            check_attention(g2, random_plan(77, 2, 1), dtype=torch.float64, routing=True, hq=2, hkv=1)
        sub2 = dist.new_group([2, 3])
        if rank >= 2:
            g3 = ZeppelinGroup(process_group=sub2, gpus_per_node=2)
            check_attention(g3, random_plan(78, 1, 2), dtype=torch.float64, routing=False, hq=2, hkv=2)
    if world == 2:
        # groups of one: no communication at all
        singles = [dist.new_group([r]) for r in range(world)]
        g1 = ZeppelinGroup(process_group=singles[rank], gpus_per_node=1)
        plan = random_plan(9, 1, 1)
        check_remap(g1, plan)
        check_attention(g1, plan, dtype=torch.float64, routing=True, hq=4, hkv=2)
        x = torch.randn(5, 2)
        assert torch.equal(all_to_all_uneven(x, [5], [5], g1), x)
    expected = {"local", "intra_node", "inter_node"} if world >= 4 else {"local", "intra_node", "inter_node"}
    assert seen >= expected, f"plans covered only {seen}"
    if heads:  # head-parallel rings in this spawn too (heads_workers.py)
        import heads_workers
        heads_workers.run_heads(rank, world, heads, heads_full, seed0)
