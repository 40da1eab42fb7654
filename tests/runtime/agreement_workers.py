"""Checks that run inside spawned gloo ranks: the start-of-call check and the Zeppelin timeout."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any, Callable

import torch
import torch.distributed as dist

import runtime_workers
from plan_factory import random_plan
from zeppelin_megatron.megatron.groups import zeppelin_group_over
from zeppelin_megatron.planner.plan import StepPlan
from zeppelin_megatron.runtime import (
    AgreementError,
    BackendUnavailableError,
    PlanMismatchError,
    RuntimeInputError,
    ZeppelinCommError,
    ZeppelinGroup,
    ZeppelinTimeoutError,
    zeppelin_attention,
)
from zeppelin_megatron.runtime import attention as attention_mod
from zeppelin_megatron.runtime.agreement import CallTerms, check_agreement
from zeppelin_megatron.runtime.comm import P2P, post

HQ, HKV, D = 4, 2, 8


def _raises(exc_type: type[BaseException], fragments: list[str], fn: Callable[[], Any], exact: bool = True) -> str:
    """``fn()`` raises ``exc_type`` (exactly, unless ``exact`` is False) whose message holds every fragment."""
    try:
        fn()
    except exc_type as exc:
        msg = str(exc)
        assert not exact or type(exc) is exc_type, f"expected {exc_type.__name__}, got {type(exc).__name__}: {msg}"
        for frag in fragments:
            assert frag in msg, f"rank {dist.get_rank()}: error {msg!r} does not mention {frag!r}"
        return msg
    raise AssertionError(f"rank {dist.get_rank()}: expected {exc_type.__name__} mentioning {fragments}")


def _inputs(plan: StepPlan, rank: int, *, hq: int = HQ, hkv: int = HKV, d: int = D,
            dtype: torch.dtype = torch.float64, grad: bool = True) -> tuple[torch.Tensor, ...]:
    n = plan.tokens(rank, "linear")
    g = torch.Generator().manual_seed(rank)
    q = torch.randn(n, hq, d, generator=g, dtype=dtype).requires_grad_(grad)
    k = torch.randn(n, hkv, d, generator=g, dtype=dtype).requires_grad_(grad)
    v = torch.randn(n, hkv, d, generator=g, dtype=dtype).requires_grad_(grad)
    return q, k, v


def check_disagreements(group: ZeppelinGroup, plan: StepPlan, other_plan: StepPlan, odd: int) -> None:
    """Rank ``odd`` differs in one field at a time; every rank raises naming the field and rank ``odd``."""
    rank = group.rank
    who = group.describe_ranks([odd])  # e.g. "rank 1 (node 0, local 1)"
    me_odd = rank == odd
    base = _inputs(plan, rank)

    def call(*, plan_: StepPlan = plan, inputs: tuple[torch.Tensor, ...] = base, **kw: Any) -> Callable[[], Any]:
        return lambda: zeppelin_attention(*inputs, plan_, group, **kw)

    # softmax scale: the default 1/sqrt(8) = 0.353553391 on all ranks but one
    kw = {"softmax_scale": 0.5} if me_odd else {}
    _raises(AgreementError, ["softmax_scale differs", "0.353553391", f"{who} has 0.5"], call(**kw))
    # query heads: Hq = 2 on one rank (still a multiple of Hkv = 2)
    inp = _inputs(plan, rank, hq=2) if me_odd else base
    _raises(AgreementError, ["hq differs", f"{who} has 2"], call(inputs=inp))
    # key/value heads: Hkv = 1 on one rank
    inp = _inputs(plan, rank, hkv=1) if me_odd else base
    _raises(AgreementError, ["hkv differs", f"{who} has 1"], call(inputs=inp))
    # head dim 16 on one rank (its default scale differs too: both fields are named)
    inp = _inputs(plan, rank, d=16) if me_odd else base
    msg = _raises(AgreementError, ["head_dim differs", f"{who} has 16"], call(inputs=inp))
    assert "softmax_scale differs" in msg, msg
    # dtype: float32 on one rank
    inp = _inputs(plan, rank, dtype=torch.float32) if me_odd else base
    _raises(AgreementError, ["dtype differs", f"{who} has torch.float32", "torch.float64"], call(inputs=inp))
    # routing off on one rank
    _raises(AgreementError, ["routing differs", f"{who} has off"], call(routing=not me_odd))
    # the check setting off on one rank (the call still checks: the Megatron path's first layer)
    _raises(AgreementError, ["check_setting differs", f"{who} has off"], call(check_setting=not me_odd))
    # autograd: one rank calls without gradients (it would skip the backward the others run)
    inp = _inputs(plan, rank, grad=False) if me_odd else base
    _raises(AgreementError, ["grad differs", f"{who} has off"], call(inputs=inp))
    # the plan: one rank holds another plan; named even with another difference on top
    kw = {"softmax_scale": 0.5} if me_odd else {}
    msg = _raises(PlanMismatchError, ["different step plans", "plan differs", who], call(
        plan_=other_plan if me_odd else plan, **kw))
    assert "softmax_scale differs" in msg, msg
    # a backend missing on one rank: its own error there, a pointer to it elsewhere
    if me_odd:
        _raises(BackendUnavailableError, ["'flash_attn' is unavailable on cpu"], call(backend="flash_attn"))
    else:
        _raises(RuntimeInputError, [f"{who} of the Zeppelin group rejected its inputs"], call())
    # an invalid softmax scale on one rank
    if me_odd:
        _raises(RuntimeInputError, ["softmax_scale must be a positive finite number, got -1.0"],
                call(softmax_scale=-1.0))
    else:
        _raises(RuntimeInputError, [f"{who} of the Zeppelin group rejected its inputs"], call())
    # fields the CPU cannot vary through zeppelin_attention (kernel, device): the check itself
    terms = CallTerms.of_call(plan=plan, q=base[0], k=base[1], scale=0.25, routing=True, check_setting=True,
                              kernel="reference", problem=None)
    _raises(AgreementError, ["kernel differs", f"{who} has flash_attn", "reference"],
            lambda: check_agreement(replace(terms, kernel=2) if me_odd else terms, group, torch.device("cpu")))
    _raises(AgreementError, ["device differs", f"{who} has cuda", "cpu"],
            lambda: check_agreement(replace(terms, device=1) if me_odd else terms, group, torch.device("cpu")))
    # several ranks differing: each value lists its ranks
    if group.size >= 3:
        kw = {"softmax_scale": 0.5} if rank != 0 else {}
        others = group.describe_ranks([r for r in range(group.size) if r != 0])
        _raises(AgreementError, [f"{others} have 0.5", f"{group.describe_ranks([0])} has 0.353553391"], call(**kw))
    # nothing left hanging: a good call still matches the float64 reference, with checks on every call
    runtime_workers.check_attention(group, plan, dtype=torch.float64, routing=True, hq=HQ, hkv=HKV, d=D)


def run_agreement(rank: int, world: int, gpus_per_node: int, seed: int) -> None:
    torch.manual_seed(0)
    group = ZeppelinGroup(process_group=None, gpus_per_node=gpus_per_node)
    nodes = world // gpus_per_node
    plan = random_plan(seed, nodes, gpus_per_node)
    other = random_plan(seed + 1, nodes, gpus_per_node)
    assert plan.digest() != other.digest()
    for odd in sorted({1, world - 1}):
        check_disagreements(group, plan, other, odd)


# -- timeouts ---------------------------------------------------------------------------------------


def _timed(exc_type: type[BaseException], fragments: list[str], fn: Callable[[], Any], limit: float,
           exact: bool = True) -> float:
    t0 = time.monotonic()
    _raises(exc_type, fragments, fn, exact)
    took = time.monotonic() - t0
    assert took <= limit, f"the error came after {took:.1f} s, more than {limit} s"
    return took


def run_timeouts(rank: int, world: int, timeout_s: float) -> None:
    """Rank ``world - 1`` fails in several ways and stays alive; the others raise within the timeout.

    Each case gets a fresh Zeppelin group (made as the Megatron path makes it, with the timeout):
    a group that timed out is broken for good. With 3 ranks or more, two ranks wait in one
    collective: the first to time out closes its connections, so the other may fail at that
    moment with ZeppelinCommError ("Connection closed by peer") instead of its own timeout;
    both name the step, and both come within the limit.
    """
    gpn = world  # one node
    everyone = tuple(range(world))
    bad = world - 1
    plan = random_plan(5, 1, gpn, n_inter_rings=0)
    limit = timeout_s * 2 + 5
    hints = [f"timed out after {timeout_s:g} s"]
    alone = world == 2  # the only waiting rank: its own timeout, never a neighbour's closed connection
    names_bad = re.compile(rf"(waiting for|with) ranks? [^:]*\b{bad}\b")

    # 1. the failing rank raises before the call (caught by user code) and stays alive
    group = zeppelin_group_over([everyone], gpn, timeout_s)
    assert group.timeout_s == timeout_s
    q, k, v = _inputs(plan, rank)
    if rank == bad:
        try:
            raise ValueError("user code failed before attention")
        except ValueError:
            pass
    else:
        peers = group.describe_ranks([r for r in everyone if r != rank])  # a collective: all the others
        frags = ["start-of-call agreement check", peers] + (hints if alone else [])
        took = _timed(ZeppelinTimeoutError if alone else ZeppelinCommError, frags,
                      lambda: zeppelin_attention(q, k, v, plan, group), limit, exact=alone)
        if alone:
            assert took >= timeout_s * 0.8, f"raised after {took:.1f} s, before the {timeout_s} s timeout"
    dist.barrier()  # default group: the failed rank is alive and joins here

    # 2. a point-to-point wait names the step and the peer
    group = zeppelin_group_over([everyone], gpn, timeout_s)
    if rank == 0:
        buf = torch.zeros(4)
        posted = post([P2P(peer=bad, tensor=buf, send=False)], group, what="ring 7 step 3")
        _timed(ZeppelinTimeoutError,
               hints + [f"ring 7 step 3 (receive from rank {bad})", f"waiting for {group.describe_ranks([bad])}"],
               posted.wait, limit)
    dist.barrier()

    # 3. the failing rank passes the check, then raises inside the call (before the remap) and stays alive
    group = zeppelin_group_over([everyone], gpn, timeout_s)
    real = attention_mod.AttentionEngine  # built by every call before its remap and engine
    if rank == bad:
        def failing(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("injected failure after the check")
        attention_mod.AttentionEngine = failing  # type: ignore[assignment,misc]
        try:
            _raises(RuntimeError, ["injected failure"], lambda: zeppelin_attention(q, k, v, plan, group))
        finally:
            attention_mod.AttentionEngine = real  # type: ignore[misc]
    else:  # waiting in the remap all_to_all (all the others) or a ring transfer (that rank)
        msg = ""

        def call() -> None:
            nonlocal msg
            try:
                zeppelin_attention(q, k, v, plan, group)
            except ZeppelinCommError as exc:
                msg = str(exc)
                raise
        _timed(ZeppelinTimeoutError if alone else ZeppelinCommError, hints if alone else [], call, limit,
               exact=alone)
        assert names_bad.search(msg), f"rank {rank}: {msg!r} does not name rank {bad} as a peer"
    dist.barrier()

    # 4. the failing rank passes the check and the remap, then raises before its ring transfers:
    #    on 2 ranks (every ring spans both) the other one times out in a ring step naming it
    if world == 2:
        group = zeppelin_group_over([everyone], gpn, timeout_s)
        assert any(len(r.ranks) == 2 for r in plan.rings), "the plan needs a ring over both ranks"
        from zeppelin_megatron.runtime.engine import AttentionEngine
        real_forward = AttentionEngine.forward  # runs after the remap in (runtime/overlap.py)
        if rank == bad:
            def failing(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("injected failure before the rings")
            AttentionEngine.forward = failing  # type: ignore[method-assign]
            try:
                _raises(RuntimeError, ["injected failure"], lambda: zeppelin_attention(q, k, v, plan, group))
            finally:
                AttentionEngine.forward = real_forward  # type: ignore[method-assign]
        else:
            msg = _raises(ZeppelinTimeoutError, hints + [f"waiting for {group.describe_ranks([bad])}"],
                          lambda: zeppelin_attention(q, k, v, plan, group))
            assert " ring " in msg and " step " in msg and f"rank {bad})" in msg, msg
        dist.barrier()

    # 5. nothing is wrong: a fresh group computes the right answer (a generous timeout: this is not
    #    a timing test, and the shared test machine may be loaded)
    group = zeppelin_group_over([everyone], gpn, 60.0)
    runtime_workers.check_attention(group, plan, dtype=torch.float64, routing=True, hq=HQ, hkv=HKV, d=D)


def run_dead_peer(rank: int, world: int) -> None:
    """Rank ``world - 1`` exits after a good call; the others raise ZeppelinCommError at once, naming it."""
    import os

    everyone = tuple(range(world))
    group = zeppelin_group_over([everyone], world, 60.0)
    plan = random_plan(3, 1, world, n_inter_rings=0)
    q, k, v = _inputs(plan, rank)
    zeppelin_attention(q, k, v, plan, group)
    dist.barrier()
    if rank == world - 1:
        os._exit(0)  # the process is gone: its sockets close
    time.sleep(1.0)
    t0 = time.monotonic()
    _raises(ZeppelinCommError, ["start-of-call agreement check", "Connection closed by peer"],
            lambda: zeppelin_attention(q, k, v, plan, group))
    assert time.monotonic() - t0 < 30, "a closed connection must fail fast, not after the 60 s timeout"
