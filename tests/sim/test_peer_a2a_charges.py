"""The peers' Ulysses all-to-all permutes (PEER_A2A_PASSES): TE CP a2a+p2p's and FlexSP's copies, charged as their
code makes them, dropped with ``charges="none"``."""

from __future__ import annotations

from collections import defaultdict

import pytest

from zeppelin_megatron.planner import CostModel, load_cluster, load_model
from zeppelin_megatron.planner.zigzag import zigzag_tokens
from zeppelin_megatron.sim import plan_with
from zeppelin_megatron.sim.charges import (
    PEER_A2A_PASSES, hbm_ms, peer_a2a_bytes, peer_a2a_permutes, shape_of, te_ring_bytes, te_step_bytes,
)
from zeppelin_megatron.sim.program import build_layer_program
from zeppelin_megatron.sim.simulator import simulate
from zeppelin_megatron.sim.te_cp_a2a_p2p import a2a_p2p_plan


def _cost(spec: str) -> CostModel:
    return CostModel(model=load_model(None), cluster=load_cluster(spec, tokens_per_gpu=65536))


def test_pass_bytes_worked_example_and_the_readings() -> None:
    cost = _cost("1x8")  # Llama-7B bf16, no TP: Eq = 4096, Ekv = 8192
    sh = shape_of(cost)
    assert (sh.eq, sh.ekv, sh.b) == (4096, 8192, 2)
    assert peer_a2a_bytes(sh, 32768) == 2 * 2 * (2 * 4096 + 8192) * 32768 == 2147483648
    assert peer_a2a_bytes(sh, 10, 0) == 0 and peer_a2a_bytes(sh, 10, 2) == 2 * peer_a2a_bytes(sh, 10)
    assert PEER_A2A_PASSES == {"te": {"in": (1, 1), "out": (1, 1)}, "ulysses": {"in": (1, 0), "out": (0, 1)}}
    assert te_ring_bytes(sh, 1000) == 1000 * (2 * (4096 + 4 * 8192) + 4 * 32)
    # per (direction, side): in sends own and receives got, out the reverse; FlexSP copies on one side each
    one, two = peer_a2a_bytes(sh, 10), peer_a2a_bytes(sh, 30)
    assert peer_a2a_permutes(sh, "te", 10, 30) == {("in", 0): one, ("in", 1): two, ("out", 0): two, ("out", 1): one}
    assert peer_a2a_permutes(sh, "ulysses", 10, 30) == {("in", 0): one, ("in", 1): 0, ("out", 0): 0, ("out", 1): one}


def test_te_step_bytes_by_kind() -> None:
    sh = shape_of(_cost("1x8"))  # Eq 4096, Ekv 8192, Hq 32, b 2, a 4
    base = 6 * 2 * 1024 * 4096 + 3 * 2 * 512 * 8192  # output correction, dQ, dK/dV (bf16)
    assert te_step_bytes(sh, 1024, 512, "early") == base + 5 * 4 * 1024 * 32 + 4 * 2 * 512 * 8192  # K/V halves
    base = 6 * 2 * 512 * 4096 + 3 * 2 * 1024 * 8192
    assert te_step_bytes(sh, 512, 1024, "late") == base + 5 * 4 * 512 * 32 + 8 * 2 * 512 * 4096  # q, out, dout halves
    assert te_step_bytes(sh, 1024, 1024, "diag") == 6 * 2 * 1024 * 4096 + 3 * 2 * 1024 * 8192 + 4 * 4 * 1024 * 32
    assert round(te_step_bytes(sh, 1024, 512, "early") / 1e6, 1) == 109.7  # the docstring's example
    with pytest.raises(ValueError, match="'mid'"):
        te_step_bytes(sh, 1, 1, "mid")


def test_te_a2a_p2p_pays_four_permutes_per_rank() -> None:
    # 1 node x 2 GPUs, a2a 2 x p2p 1: each rank holds 4096 tokens; one pass each side of both all-to-alls.
    cost = _cost("1x2")
    plan, _ = a2a_p2p_plan([4096, 4096], cost.cluster, cost, a2a=2, p2p=1)
    prog = build_layer_program(plan, cost, "a2a_p2p", charges="te")
    one = hbm_ms(cost, peer_a2a_bytes(shape_of(cost), 4096))
    for ops in prog.ops:
        perm = [op for op in ops if op.label.endswith("permute")]
        assert [op.label.split(": ")[1] for op in perm] == ["sender's permute", "receiver's permute"] * 2
        assert all(op.kind == "copy" and op.ms == pytest.approx(one, rel=1e-12) for op in perm)
        assert not any(op.label.endswith("ring buffers") for op in ops)  # p2p = 1: TE's plain a2a, no ring
    te = simulate(plan, cost, attention_comm="a2a_p2p", charges="te").layer_ms
    bare = simulate(plan, cost, attention_comm="a2a_p2p", charges="none").layer_ms
    assert te == pytest.approx(bare + 4 * one, rel=1e-9)


def test_te_a2a_p2p_ring_members_build_their_buffers_once() -> None:
    cost = _cost("2x2")  # a2a 2 x p2p 2: rings (0, 2) and (1, 3) with half of the heads
    n = 16384
    plan, _ = a2a_p2p_plan([n], cost.cluster, cost, a2a=2, p2p=2)
    prog = build_layer_program(plan, cost, "a2a_p2p", charges="te")
    for ops in prog.ops:
        (buf,) = [op for op in ops if op.label.endswith("ring buffers")]
        # a ring position's n / p tokens at 1 / a of the heads: n / 2 / 2 rows' worth of full-head rows
        assert buf.ms == pytest.approx(hbm_ms(cost, te_ring_bytes(shape_of(cost), n / 2 / 2)), rel=1e-9)
        assert len([op for op in ops if op.label.endswith("permute")]) == 4
    bare = build_layer_program(plan, cost, "a2a_p2p", charges="none")
    assert not [op for ops in bare.ops for op in ops if op.kind == "copy"]


def test_flexsp_pays_one_permute_per_all_to_all() -> None:
    cost = _cost("2x4")
    sp = plan_with("flexsp", [40000, 20000, 6000, 3000, 900, 400], cost.cluster, cost)
    prog = build_layer_program(sp.plan, cost, sp.attention_comm, charges="te")
    sh = shape_of(cost)
    held: dict[int, int] = defaultdict(int)
    grouped = set()
    for s in sp.plan.sequences:
        if s.placement != "local":
            grouped.update(s.ranks)
            for p, r in enumerate(s.ranks):
                held[r] += zigzag_tokens(s.length, len(s.ranks), p)
    assert grouped
    for r in range(8):
        perm = [op for op in prog.ops[r] if op.label.endswith("permute")]
        if r not in grouped:
            assert not perm
            continue
        # heads scattered: the sender's copy before the all-to-all in; gathered: the receiver's after the one out
        assert [op.label.split(": ")[1] for op in perm] == ["sender's permute", "receiver's permute"]
        assert [op.label.split(": ")[0].rsplit(" ", 1)[1] for op in perm] == ["in", "out"]
        assert sum(op.ms for op in perm) == pytest.approx(2 * hbm_ms(cost, peer_a2a_bytes(sh, held[r])), rel=1e-9)
    bare = build_layer_program(sp.plan, cost, sp.attention_comm, charges="none")
    assert not [op for ops in bare.ops for op in ops if op.label.endswith("permute")]
    assert simulate(sp.plan, cost, attention_comm="ulysses", charges="te").layer_ms > \
        simulate(sp.plan, cost, attention_comm="ulysses", charges="none").layer_ms
