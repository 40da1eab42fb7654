"""Head-parallel rings in the simulator (sim/program.py, sim/charges.py): hand-computed layers of a
Ulysses ring and a hybrid ring, bytes per transfer, a charge per new op, the same-plan ablation, and
Zeppelin's hybrid against TE CP a2a+p2p's model of the same group."""

from __future__ import annotations

from zigzag_plans import zigzag_plan
from collections import Counter
from dataclasses import replace

import pytest

from zeppelin_megatron.planner import Cluster, CostModel, load_cluster, load_model
from zeppelin_megatron.planner.lowering import RingCall, lower
from zeppelin_megatron.planner.model import ModelShape
from zeppelin_megatron.planner.plan import LocalSlot, StepPlan
from zeppelin_megatron.planner.zigzag import ring_chunk_pair_tokens, zigzag_ranges
from zeppelin_megatron.sim.charges import (
    A2A_PARTS, Shape, a2a_token_bytes, hbm_ms, shape_of, te_a2a_bytes, te_ring_bytes, te_step_bytes,
    zeppelin_a2a_bytes, zeppelin_call_bytes, zeppelin_remap_bytes,
)
from zeppelin_megatron.sim.program import Traffic, build_layer_program, plain_rings
from zeppelin_megatron.sim.simulator import simulate
from zeppelin_megatron.sim.te_cp_a2a_p2p import a2a_p2p_plan

NVL = 4e8  # 400 GB/s in bytes per ms
NIC = 5e7  # 400 Gb/s


def _cluster(nodes: int, gpus: int) -> Cluster:
    return Cluster(nodes=nodes, gpus_per_node=gpus, nics_per_node=gpus, gpu_nic=tuple(range(gpus)),
                   nvlink_GBps=400.0, nic_Gbps=400.0, tokens_per_gpu=1 << 20, nvlink_latency_us=5.0,
                   nic_latency_us=10.0)


def _cost(cluster: Cluster, model: ModelShape | None = None) -> CostModel:
    return CostModel(model=model or replace(load_model(None), layers=1), cluster=cluster)  # Llama-7B, MHA, bf16


_plan = zigzag_plan


def _legs(prog, kind: str) -> list[tuple[int, int, float, str]]:  # type: ignore[no-untyped-def]
    (key,) = [k for k in prog.transfers if k[-1] == kind or (kind == "kv" and "kv" in k)]
    return sorted((leg.src, leg.dst, leg.nbytes, leg.link) for chain in prog.transfers[key].chains for leg in chain)


def _messages(prog, kind: str) -> list[tuple[int, int, int]]:  # type: ignore[no-untyped-def]
    """(sender, receiver, messages) of each leg: a head-parallel pair's messages (one per run) are one flow."""
    (key,) = [k for k in prog.transfers if k[-1] == kind]
    return sorted((leg.src, leg.dst, leg.messages) for chain in prog.transfers[key].chains for leg in chain)


def test_ulysses_ring_by_hand() -> None:
    """One sequence of 8192 tokens, Ulysses over the 4 GPUs of a node (``a2a = 4``, one block).

    Llama-7B (Hq = Hkv = 32, D = 128, bf16). Each rank holds 2 zigzag chunks of 1024 tokens (2048);
    its lane has 8 query and 8 K/V heads: Eq' = 1024, Ekv' = 2048 elements per token.

    * heads all-to-all: each rank sends each other rank its 2048 tokens x 2 B x (2 Eq' + Ekv') =
      2048 x 8192 = 16 777 216 B, one message per run of its tokens in the head buffer (lanes 0-2: chunks
      ``l`` and ``7 - l``, two runs of 1024 tokens; lane 3: chunks 3 and 4 meet, one run); a pair's messages
      are one flow that waits the 5 us latency per message, and the flows share the 400 GB/s NVLink port:
      2 x 5 us + 3 x 16 777 216 / 4e8 B/ms = 0.13582912 ms (the baselines' Ulysses group: one message per
      pair, 0.13082912 ms);
    * tokens all-to-all: 2048 x 2 B x (2 Eq' + Ekv') = 16 777 216 B, as heads (dq, dk, dv of the one call in the
      model dtype: nothing accumulated);
    * one causal call over the whole sequence with 8 of 32 heads: causal_ms(8192) / 4 (>= call overhead);
      no K/V transfer (one block);
    * charges (bf16 b = 2; n = 2048 own rows, one range of the attention buffer: views and slice copies;
      N = 8192 head-buffer rows; runtime/heads.py, engine.ulysses_*): heads pack: q copied into the send
      buffer 2 b n Eq = 33 554 432, k, v 2 b n Ekv = 67 108 864, own slot 2 b n (Eq' + Ekv') = 25 165 824,
      dout 2 b n Eq = 33 554 432, its own slot 2 b n Eq' = 8 388 608: 167 772 160 B; heads unpack: nothing
      (every message lands at its head-buffer rows; q, k, v and dout are views of what arrived); tokens
      pack: out's own slot 2 b n Eq' = 8 388 608, the gradients' own slot 2 b n (Eq' + Ekv') = 25 165 824
      (the kernel writes them into the send buffer): 33 554 432 B;
      tokens unpack: out home per lane 2 b n Eq = 33 554 432, dq 2 b n Eq = 33 554 432, dK/dV (each K/V head
      in one lane) 2 b n Ekv = 67 108 864: 134 217 728 B; the call: the kernel's lse transpose 2 a N Hq' =
      524 288 (a = 4).
    """
    cl = _cluster(1, 4)
    cost = _cost(cl)
    plan = _plan([(8192, (0, 1, 2, 3), 4)], 1, 4)
    assert plan.rings[0].blocks == 1
    o, lin = cost.call_overhead_ms, cost.linear_ms(2048)
    kernel = max(cost.causal_ms(8192) / 4, o)
    heads = tokens = 0.010 + 3 * 16_777_216 / NVL
    assert heads == pytest.approx(0.13582912)
    assert simulate(plan, cost, charges="none").layer_ms == pytest.approx(lin + 2 * heads + kernel, rel=1e-12)
    # the simulator's Ulysses group kind (baselines) without charges: the same but for one message per pair
    same = replace(plan, sequences=(replace(plan.sequences[0], a2a=1),))
    assert simulate(same, cost, attention_comm="ulysses", charges="none").layer_ms == pytest.approx(
        lin + 2 * (heads - 0.005) + kernel, rel=1e-12)
    prog = build_layer_program(plan, cost)
    pairs = [(x, y) for x in range(4) for y in range(4) if x != y]
    assert _legs(prog, "heads") == sorted((x, y, 16_777_216.0, "nvl") for x, y in pairs)
    assert _legs(prog, "tokens") == sorted((y, x, 16_777_216.0, "nvl") for x, y in pairs)
    runs = {0: 2, 1: 2, 2: 2, 3: 1}  # lane x's runs: messages per pair it sends (heads) or receives (tokens)
    assert _messages(prog, "heads") == sorted((x, y, runs[x]) for x, y in pairs)
    assert _messages(prog, "tokens") == sorted((y, x, runs[x]) for x, y in pairs)
    assert not [k for k in prog.transfers if "kv" in k]
    copies = {op.label.rsplit(") ", 1)[-1]: op.ms for op in prog.ops[0] if op.kind == "copy"}
    hand = {"heads pack": 167_772_160, "heads unpack": 0, "tokens pack": 33_554_432, "tokens unpack": 134_217_728}
    call = 524_288
    assert zeppelin_a2a_bytes(shape_of(cost), 4, 2048, 8192, contiguous=True, blocks=1) == hand
    assert plan.rings[0].ranks == (0, 1, 2, 3) and lower(plan).ranks[0].rings[0].span is not None
    for part, nbytes in hand.items():
        kind, which = part.split()
        assert copies.get(f"to {kind}: {which}", 0.0) == pytest.approx(hbm_ms(cost, nbytes), rel=1e-12)
    assert copies["step 0 merges and row copies"] == pytest.approx(hbm_ms(cost, call), rel=1e-12)
    remap = zeppelin_remap_bytes(shape_of(cost), plan)[0]  # the remap_parts the runtime runs even unmoved
    layer = lin + hbm_ms(cost, remap + sum(hand.values()) + call) + heads + tokens + kernel
    assert simulate(plan, cost).layer_ms == pytest.approx(layer, rel=1e-12)


def test_hybrid_ring_by_hand() -> None:
    """One sequence of 16384 tokens over ranks (0, 1, 2, 3) of 2 nodes x 2 GPUs, ``a2a = 2``.

    Blocks 0 = ranks (0, 1) (node 0, tokens [0, 4096) + [12288, 16384)) and 1 = (2, 3); each rank holds
    4096 tokens; a lane has 16 of the 32 heads: Eq' = 2048, Ekv' = 4096, Hq' = 16.

    * heads: 4096 x 2 x (2 Eq' + Ekv') = 67 108 864 B per lane pair, one message per run (lane 0: chunks 0
      and 7 of 2048 tokens, two runs; lane 1: chunks 1 and 6 meet, one run), a pair's messages one flow
      waiting 5 us per message: 2 x 5 us + /4e8 = 0.17777216 ms for lane 0's;
    * tokens: 4096 x (2 Eq' + 2 (Eq' + Ekv')) = 67 108 864 B: 0.17777216 ms, lane 0's two runs coming home
      (dq, dk, dv cast once on the sender: each K/V head is in one lane; 117 440 512 B with them in fp32);
    * the lane rings (0, 2) and (1, 3) over the NICs: one K/V step of 4 x 2 B x Ekv' x
      ring_chunk_pair_tokens(16384, 2) = 4 x 2 x 4096 x 8192 = 268 435 456 B: 10 us + /5e7 = 5.37870912 ms
      (3 x without the fp32 accumulator: 4.03653184 ms);
    * step 0: the block's diagonal, causal_ms(8192) / 2; step 1: block 0 is ``late`` (its 4096 late rows
      against block 1's 8192 keys: block_fitted_ms(4096, 8192) / 2), block 1 ``early`` (8192 rows against
      block 0's 4096 early keys: block_fitted_ms(8192, 4096) / 2); uncharged: block_ms(8192, 4096) / 2 both;
    * charges (n = 4096 own rows, one range: views; N = 8192 head-buffer rows; fp32 accumulators a = 4 over
      the ring's two blocks): heads pack: q, k, v copied into the send buffer 2 b n (Eq + Ekv) = 201 326 592,
      own slot 2 b n (Eq' + Ekv') = 100 663 296, dout 2 b n Eq = 67 108 864 and its own slot 2 b n Eq' =
      33 554 432: 402 653 184 B; unpack: q and the packed K/V copied out of what arrived 2 b N (Eq' + Ekv') =
      201 326 592, dq zeros a N Eq' = 67 108 864 (dout is what arrived): 268 435 456 B; tokens pack: out .to
      N Eq' (a + b) = 100 663 296 (sent as it is), own slot 2 b n Eq' = 33 554 432, the gradients cast into
      the send buffer N (Eq' + Ekv')(a + b) = 301 989 888, their own slot in bf16 2 b n (Eq' + Ekv') =
      100 663 296: 536 870 912 B; unpack: out
      home 2 b n Eq = 67 108 864, dq home 2 b n Eq = 67 108 864, dK/dV home (each K/V head in one lane)
      2 b n Ekv = 134 217 728: 268 435 456 B; each call's merges and copies at the lane's shape.
    """
    cl = _cluster(2, 2)
    cost = _cost(cl)
    plan = _plan([(16384, (0, 1, 2, 3), 2)], 2, 2)
    o, lin = cost.call_overhead_ms, cost.linear_ms(4096)
    heads, tokens = 0.010 + 67_108_864 / NVL, 0.010 + 67_108_864 / NVL
    kv, kv3 = 0.01 + 268_435_456 / NIC, 0.01 + 201_326_592 / NIC
    assert (heads, tokens, kv, kv3) == pytest.approx((0.17777216, 0.17777216, 5.37870912, 4.03653184))
    diag = cost.causal_ms(8192) / 2
    off = cost.block_ms(8192, 4096) / 2
    assert simulate(plan, cost, charges="none").layer_ms == pytest.approx(
        lin + 2 * heads + max(max(diag, o), kv3) + max(off, o), rel=1e-12)
    prog = build_layer_program(plan, cost)
    assert _legs(prog, "heads") == [(0, 1, 67_108_864.0, "nvl"), (1, 0, 67_108_864.0, "nvl"),
                                    (2, 3, 67_108_864.0, "nvl"), (3, 2, 67_108_864.0, "nvl")]
    assert {x[2] for x in _legs(prog, "tokens")} == {67_108_864.0}
    assert _messages(prog, "heads") == [(0, 1, 2), (1, 0, 1), (2, 3, 2), (3, 2, 1)]  # lane 0: two runs
    assert _messages(prog, "tokens") == [(0, 1, 1), (1, 0, 2), (2, 3, 1), (3, 2, 2)]
    assert _legs(prog, "kv") == [(0, 2, 268_435_456.0, "nic"), (1, 3, 268_435_456.0, "nic"),
                                 (2, 0, 268_435_456.0, "nic"), (3, 1, 268_435_456.0, "nic")]
    lane = Shape(eq=2048, ekv=4096, hq=16, b=2, a=4)
    got = shape_of(cost, 2)
    assert (got.eq, got.ekv, got.hq, got.b, got.a) == (lane.eq, lane.ekv, lane.hq, lane.b, lane.a)
    low = lower(plan)
    remap = zeppelin_remap_bytes(shape_of(cost), plan)
    hand = {"heads pack": 402_653_184, "heads unpack": 268_435_456, "tokens pack": 536_870_912,
            "tokens unpack": 268_435_456}
    assert zeppelin_a2a_bytes(shape_of(cost), 2, 4096, 8192, contiguous=True, blocks=2) == hand
    finish = []
    for r in range(4):
        d0, d1 = [op for op in low.ranks[r].forward if isinstance(op, RingCall)]
        assert (d0.kind, d1.kind) == ("diag", "late" if r < 2 else "early")
        step1 = cost.block_fitted_ms(4096, 8192) / 2 if r < 2 else cost.block_fitted_ms(8192, 4096) / 2
        copy0 = zeppelin_call_bytes(lane, d0, first_late=False)
        copy1 = zeppelin_call_bytes(lane, d1, first_late=d1.kind == "late")
        start = lin / 2 + hbm_ms(cost, remap[r]) / 2 + hbm_ms(cost, hand["heads pack"]) + heads
        start += hbm_ms(cost, hand["heads unpack"])
        ring = max(start + max(diag, o) + hbm_ms(cost, copy0), start + kv) + max(step1, o) + hbm_ms(cost, copy1)
        end = hbm_ms(cost, hand["tokens pack"]) + tokens + hbm_ms(cost, hand["tokens unpack"])
        finish.append(ring + end + hbm_ms(cost, remap[r]) / 2 + lin / 2)
        labels = [op.label.rsplit(") ", 1)[-1] for op in prog.ops[r] if op.kind == "copy" and "a2a" in op.label]
        assert labels == ["to heads: pack", "to heads: unpack", "step 0 merges and row copies",
                          "step 1 merges and row copies", "to tokens: pack", "to tokens: unpack"]
    assert simulate(plan, cost).layer_ms == pytest.approx(max(finish), rel=1e-12)


def test_lane_bytes_per_token_and_gqa_replication() -> None:
    """GQA 8 query / 2 K/V heads, D = 64, width 4: one K/V head per lane, replicated over two lanes, so a
    lane's K/V are 2 x 1 x 64 elements per token (not 2 x 2 / 4); width 3 does not split the heads."""
    gqa = ModelShape(layers=1, hidden=512, q_heads=8, kv_heads=2, ffn=1024, head_dim=64, name="gqa")
    cost = _cost(_cluster(1, 4), gqa)
    sh = shape_of(cost, 4)
    assert (sh.eq, sh.ekv, sh.hq) == (2 * 64, 2 * 1 * 64, 2)
    heads, tokens = a2a_token_bytes(sh, shared=True)  # lanes share K/V heads: dq, dk, dv in fp32, summed at home
    assert (heads, tokens) == (2 * (2 * 128 + 128), 2 * 128 + 4 * (128 + 128))
    assert (a2a_token_bytes(sh, "te", shared=True) == a2a_token_bytes(sh, blocks=1, shared=True) == a2a_token_bytes(sh)
            == (768, 2 * 128 + 2 * 256))  # TE's a2a, one block, or each K/V head in one lane: the model dtype
    # a sender packs 4 lanes x 1 K/V head = 4 x 64 x 2 K/V elements per token (its 2 x 2 x 64 picked first):
    # heads pack 40 960 + 10 240 + pick 20 480 + copy 20 480 + own 10 240 + dout 40 960 + 5 120 (n = 10);
    # tokens unpack: out 20 480, dK/dV zeros 10 240, dq 51 200, index_add_ 61 440, dK/dV home 25 600
    got = zeppelin_a2a_bytes(shape_of(cost), 4, 10, 40)
    assert (got["heads pack"], got["tokens unpack"]) == (148_480, 168_960)
    # one block, rows in one range: no gathers (-51 200), and the shared heads summed in fp32 from bf16
    # (zeros 10 240, .to 30 720, index_add_ 61 440, home 15 360) after dq home 20 480 and out 20 480
    lean = zeppelin_a2a_bytes(shape_of(cost), 4, 10, 40, contiguous=True, blocks=1)
    assert (lean["heads pack"], lean["tokens unpack"]) == (97_280, 20_480 + 20_480 + 10_240 + 30_720 + 61_440
                                                            + 15_360)
    mha = zeppelin_a2a_bytes(shape_of(_cost(_cluster(1, 4), replace(gqa, kv_heads=8))), 4, 10, 40)
    assert mha["heads pack"] == 40_960 + 40_960 + 40_960 + 15_360 + 40_960 + 5_120  # Hkv = 8: no pick
    with pytest.raises(ValueError, match="width 3 cannot split 8 query and 2 K/V heads.*3 lanes do not divide 8"):
        shape_of(cost, 3)
    plan = _plan([(4000, (0, 1, 2, 3), 4)], 1, 4)
    prog = build_layer_program(plan, cost)
    held = {p: sum(b - a for a, b in zigzag_ranges(4000, 4, p)) for p in range(4)}
    pairs = [(x, y) for x in range(4) for y in range(4) if x != y]
    assert _legs(prog, "heads") == sorted((x, y, held[x] * 768.0, "nvl") for x, y in pairs)
    # one block (Ulysses): the one call's dq, dk, dv go home in the model dtype, as the heads came
    assert _legs(prog, "tokens") == sorted((y, x, held[x] * 768.0, "nvl") for x, y in pairs)


def test_each_new_op_pays_its_charge_and_rings_of_one_rank_tuple_stay_apart() -> None:
    """Two rings on the same ranks (a plain one and a hybrid one of width 2) and a local sequence in a slot
    of the hybrid: distinct transfers; every rank pays pack + unpack for each all-to-all (its own rows = its
    lowered sent and received rows, its block's rows), a lane call's kernel at half the heads, the slot's
    local call; TE charges drop the packs."""
    cl = _cluster(2, 2)
    cost = _cost(cl)
    base = _plan([(6000, (0, 1, 2, 3), 1), (9000, (0, 1, 2, 3), 2)], 2, 2, local=((300, 1),))
    hybrid = next(k for k, r in enumerate(base.rings) if r.a2a == 2)
    plan = replace(base, local_slots=(LocalSlot(1, hybrid, 0, (2,)),))
    prog = build_layer_program(plan, cost)
    keys = set(prog.transfers)
    assert ("ring", (0, 1, 2, 3), 0) in keys and ("ring", (0, 1, 2, 3), 2, "kv", 0) in keys
    assert {("ring", (0, 1, 2, 3), 2, "heads"), ("ring", (0, 1, 2, 3), 2, "tokens")} <= keys
    low = lower(plan)
    for r in range(4):
        rp = low.ranks[r]
        for kind in ("heads", "tokens"):
            (tid,) = [t for t in rp.transfers if t.kind == kind]
            sent = sum(m.tokens for m in rp.transfers[tid].messages if m.src == r)
            got = sum(m.tokens for m in rp.transfers[tid].messages if m.dst == r)
            own = sum(b - a for a, b in zigzag_ranges(9000, 4, r))
            assert sent == got == own  # width 2: one peer lane
            block = next(p for p in rp.rings if p.ring == hybrid).tokens(r // 2)
            assert block == own + sum(b - a for a, b in zigzag_ranges(9000, 4, r ^ 1))
            part = next(p for p in rp.rings if p.ring == hybrid)
            copies = zeppelin_a2a_bytes(shape_of(cost), 2, own, block, contiguous=part.span is not None,
                                        blocks=part.size)
            for which in ("pack", "unpack"):
                ms = [op.ms for op in prog.ops[r] if op.label.endswith(f"to {kind}: {which}")]
                assert ms == [pytest.approx(hbm_ms(cost, copies[f"{kind} {which}"]), rel=1e-12)]
        calls = [op for op in rp.forward if isinstance(op, RingCall) and op.ring == hybrid]
        att = [op for op in prog.ops[r] if op.kind == "attention" and "a2a 2" in op.label]
        assert len(calls) == len(att) == 2 and att[0].ms == pytest.approx(
            max(cost.ring_compute_profile(9000, 2)[0] / 2, cost.call_overhead_ms))
    ring_label = att[0].label.rsplit(" step", 1)[0]
    assert [op.label for op in prog.ops[1] if op.kind == "local"] == [f"local slot (in {ring_label} step 0)"]
    te = build_layer_program(plan, cost, charges="te")
    for r in range(4):  # TE's a2a permutes, K/V send buffer and fused correction of step 1, at the lane's heads
        own = sum(b - a for a, b in zigzag_ranges(9000, 4, r))
        block = next(p for p in low.ranks[r].rings if p.ring == hybrid).tokens(r // 2)
        want = te_a2a_bytes(shape_of(cost), 2, own, block)
        for part in A2A_PARTS:
            kind, which = part.split()
            ms = [op.ms for op in te.ops[r] if op.label.endswith(f"to {kind}: {which}")]
            assert ms == [pytest.approx(hbm_ms(cost, want[part]), rel=1e-12)]
        step0, step1 = [op for op in low.ranks[r].forward if isinstance(op, RingCall) and op.ring == hybrid]
        copies = [op.ms for op in te.ops[r] if op.kind == "copy" and "a2a 2" in op.label and "step" in op.label]
        lane = shape_of(cost, 2)
        assert copies == pytest.approx([  # the lane's ring buffers and step 0's charges, then step 1's
            hbm_ms(cost, te_ring_bytes(lane, block)
                   + te_step_bytes(lane, sum(step0.lens_q), sum(step0.lens_k), "diag")),
            hbm_ms(cost, te_step_bytes(lane, sum(step1.lens_q), sum(step1.lens_k), step1.kind))], rel=1e-12)
    res = simulate(plan, cost)
    assert res.layer_ms > simulate(plan, cost, charges="te").layer_ms > 0


def test_plain_rings_is_the_same_plan_without_head_parallel_rings() -> None:
    cl = _cluster(2, 2)
    cost = _cost(cl)
    base = _plan([(6000, (0, 1, 2, 3), 1), (9000, (0, 1, 2, 3), 2), (4000, (2, 3), 2)], 2, 2, local=((300, 1),))
    hybrid = next(k for k, r in enumerate(base.rings) if r.a2a == 2 and len(r.ranks) == 4)
    plan = replace(base, local_slots=(LocalSlot(1, hybrid, 0, (3,)),))
    flat = plain_rings(plan)
    assert [s.a2a for s in flat.sequences] == [1, 1, 1, 1]
    assert [r.ranks for r in flat.rings] == [(0, 1, 2, 3), (2, 3)] and flat.rings[0].seqs == (0, 1)
    assert flat.local_slots == (LocalSlot(1, 0, 0, (3,)),)
    assert plain_rings(flat) is flat
    assert simulate(plan, cost, head_parallel=False).layer_ms == simulate(flat, cost).layer_ms
    assert simulate(plan, cost, head_parallel=False).layer_ms != simulate(plan, cost).layer_ms


@pytest.mark.parametrize("spec,lens,a,p,gqa", [
    ("2x2", [16384], 2, 2, False),
    ("2x4", [30000, 9000, 5000, 3000], 4, 2, False),
    ("2x8", [65536, 30000, 17], 8, 2, True),
    ("1x8", [20000, 7000, 3000], 8, 1, True),
    ("4x4", [50000, 20000], 4, 4, True),
])
def test_zeppelin_hybrid_is_charged_no_less_than_te_a2a_p2p(spec: str, lens: list[int], a: int, p: int,
                                                             gqa: bool) -> None:
    """The same CP group (TE's a2a+p2p plan: consecutive blocks of ``a`` ranks, zigzag over ``a p``) run as
    Zeppelin's head-parallel ring of width ``a``. Uncharged, the two programs give the same layer (same
    structure: the heads all-to-all = TE's all-to-all in, the lane rings = TE's rings, the kernels), except
    that where a rank also holds a local sequence (2 x 8: 17 tokens) Zeppelin's lowering waits the tokens
    all-to-all after that call, so the layer is shorter. With each side's charges:

    * bytes: heads = TE's in (``held (2 q + kv) / a`` per pair); tokens = TE's out (dq, dk, dv in the model dtype:
      cast once on the sender on a ring of several blocks, one call's gradients on one block; every case here has
      each K/V head in one lane); each lane K/V step 4/3 of TE's (fp32 dK/dV accumulator);
    * copies: TE permutes on both sides of each all-to-all; Zeppelin's messages (one per run of a lane's
      tokens) land in place, so it has no receiver's pass after the ``heads`` one and sends the head buffer
      as it is in the ``tokens`` one. Without those two TE passes, every rank's copies (ring merges,
      gathers, packs, writes home) exceed TE's (output corrections, ring buffers, the other permutes);
    * kernels: diagonal steps equal; an off-diagonal call is timed by its own blocks fitted by orientation
      (``block_fitted_ms``), TE's every step by the area-averaged block (``block_ms``) of the largest chunk:
      a ``late`` (wide) call can be *below* TE's by up to ~1% of the step, its ``early`` (tall) partner as
      much above, so the sum over ranks is no less. This is a difference of kernel models (Zeppelin's is
      the newer fit; TE's peer keeps the older one), not a cost Zeppelin's engine skips;
    * the simulated layer: Zeppelin's no less than TE's less the two permutes it avoids (the slowest
      rank's): a Ulysses ring or a hybrid one with few steps can now be the faster of the two.
    """
    model = ModelShape(layers=1, hidden=4096, q_heads=32, kv_heads=8, ffn=14336, name="gqa") if gqa else None
    cost = CostModel(model=model or replace(load_model(None), layers=1),
                     cluster=load_cluster(spec, tokens_per_gpu=65536))
    te, sizes = a2a_p2p_plan(lens, cost.cluster, cost, a2a=a, p2p=p)
    assert (sizes.a2a, sizes.p2p) == (a, p)
    seqs = tuple(replace(s, a2a=a) if s.placement != "local" else s for s in te.sequences)
    zep = StepPlan(nodes=te.nodes, gpus_per_node=te.gpus_per_node, sequences=seqs,
                   attention_layout=te.attention_layout, linear_layout=te.linear_layout)
    assert [(r.ranks, r.a2a) for r in zep.rings] == [(r.ranks, a) for r in te.rings]
    z_none = simulate(zep, cost, charges="none").layer_ms
    t_none = simulate(te, cost, attention_comm="a2a_p2p", charges="none").layer_ms
    # Zeppelin sends a pair one message per run, each paying the link latency: at most 4 all-to-alls (forward and
    # backward heads and tokens) x the extra messages of its busiest pair x 5 us more
    runs = max(Counter((m.src, m.dst) for t in lower(zep).transfers.values() if t.id.kind == "heads"
                       for m in t.messages).values())
    extra = 4 * (runs - 1) * cost.cluster.nvlink_latency_us * 1e-3
    if any(s.placement == "local" for s in te.sequences):  # Zeppelin's tokens all-to-all flows under the local call
        assert z_none < t_none + extra
    else:
        assert t_none * (1 - 1e-9) <= z_none <= t_none + extra + 1e-9
    zp, tp = build_layer_program(zep, cost), build_layer_program(te, cost, "a2a_p2p")
    ring_ranks = zep.rings[0].ranks
    zt, tt = zp.transfers, tp.transfers
    z_in: dict[tuple[int, int], float] = {}  # Zeppelin sends a pair one message per run: summed
    for leg in (leg for c in zt[("ring", ring_ranks, a, "heads")].chains for leg in c):
        z_in[(leg.src, leg.dst)] = z_in.get((leg.src, leg.dst), 0.0) + leg.nbytes
    t_in = {(leg.src, leg.dst): leg.nbytes for c in tt[("a2a_p2p", ring_ranks, "in")].chains for leg in c}
    assert z_in.keys() == t_in.keys() and all(z_in[k] == pytest.approx(t_in[k], rel=1e-12) for k in t_in)
    z_out: dict[tuple[int, int], float] = {}
    for leg in (leg for c in zt[("ring", ring_ranks, a, "tokens")].chains for leg in c):
        z_out[(leg.src, leg.dst)] = z_out.get((leg.src, leg.dst), 0.0) + leg.nbytes
    t_out = {(leg.src, leg.dst): leg.nbytes for c in tt[("a2a_p2p", ring_ranks, "out")].chains for leg in c}
    assert z_out.keys() == t_out.keys()
    assert all(z_out[k] == pytest.approx(t_out[k], rel=1e-12) for k in t_out)
    if p > 1:
        z_kv = [leg.nbytes for c in zt[("ring", ring_ranks, a, "kv", 0)].chains for leg in c]
        t_kv = [leg.nbytes for i in range(a) for c in tt[("a2a_p2p", ring_ranks, "ring", i, 0)].chains for leg in c]
        assert sorted(z_kv) == pytest.approx(sorted(x * 4 / 3 for x in t_kv), rel=1e-12)

    def per_rank(prog, kind: str) -> list[float]:  # type: ignore[no-untyped-def]
        return [sum(op.ms for op in ops if op.kind == kind and not op.label.startswith(("remap", "local")))
                for ops in prog.ops]

    def avoided(ops) -> float:  # type: ignore[no-untyped-def]  # TE's passes that landing in place skips
        return sum(op.ms for op in ops if op.kind == "copy" and op.label.endswith(
            ("all-to-all in: receiver's permute", "all-to-all out: sender's permute")))

    skipped = [avoided(ops) for ops in tp.ops]
    assert all(s > 0 for s in skipped)
    assert all(z > t - x for z, t, x in zip(per_rank(zp, "copy"), per_rank(tp, "copy"), skipped))
    z_att, t_att = per_rank(zp, "attention"), per_rank(tp, "attention")
    assert sum(z_att) >= sum(t_att) * (1 - 1e-12)
    assert all(abs(z - t) <= 0.01 * t for z, t in zip(z_att, t_att))
    assert simulate(zep, cost).layer_ms > simulate(te, cost, attention_comm="a2a_p2p").layer_ms - max(skipped)


@pytest.mark.parametrize("seed", range(8))
def test_random_plans_with_head_parallel_rings_simulate_op_for_op(seed: int) -> None:
    """Random plans (plain, Ulysses and hybrid rings, local slots, routes, remap proxies; MHA and GQA heads):
    every all-to-all message is one NVLink flow of its lowered tokens x the lane's bytes per token, every
    lane K/V message one flow (NIC across nodes) of the block chunk bytes, each member pays the four
    all-to-all copies once per head-parallel ring, and the layer simulates to the end under every charge
    model and engine, and as plain rings."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from plan_factory import random_plan

    nodes, gpn = [(1, 4), (2, 2), (2, 4), (3, 2)][seed % 4]
    plan = random_plan(seed, nodes, gpn, n_local=6, n_head_rings=3, max_len=4096)
    heads = (32, 8) if seed % 2 else (32, 32)
    model = ModelShape(layers=1, hidden=4096, q_heads=heads[0], kv_heads=heads[1], ffn=14336, name="m")
    cost = _cost(_cluster(nodes, gpn), model)
    low = lower(plan)
    prog = build_layer_program(plan, cost)
    wide = [k for k, r in enumerate(plan.rings) if r.a2a > 1]
    assert wide
    for k in wide:
        ring = plan.rings[k]
        lane = shape_of(cost, ring.a2a)
        per = dict(zip(("heads", "tokens"), a2a_token_bytes(lane, blocks=ring.blocks)))
        for tid, t in low.transfers.items():
            if tid.ring != k:
                continue
            key = ("ring", ring.ranks, ring.a2a, tid.kind) + ((tid.step,) if tid.kind == "kv" else ())
            chains = prog.transfers.get(key, Traffic(key, "")).chains
            legs = sorted((leg.src, leg.dst, leg.nbytes, leg.link) for c in chains for leg in c)
            if tid.kind in per:  # one flow per pair: its messages' bytes, their count
                pairs: dict[tuple[int, int], list[int]] = {}
                for m in t.messages:
                    tally = pairs.setdefault((m.src, m.dst), [0, 0])
                    tally[0] += m.tokens
                    tally[1] += 1
                assert legs == sorted((src, dst, float(n * per[tid.kind]), "nvl")
                                      for (src, dst), (n, _) in pairs.items())
                assert sorted((leg.src, leg.dst, leg.messages) for c in chains for leg in c) == sorted(
                    (src, dst, k) for (src, dst), (_, k) in pairs.items())
            elif tid.kind == "kv":
                nbytes = 4 * lane.b * lane.ekv * sum(
                    ring_chunk_pair_tokens(plan.sequences[i].length, ring.blocks) for i in ring.seqs)
                assert legs == sorted((m.src, m.dst, float(nbytes), "nvl" if m.src // gpn == m.dst // gpn else "nic")
                                      for m in t.messages)
        for r in ring.ranks:
            mine = [op.label for op in prog.ops[r] if op.kind == "copy" and f"a2a {ring.a2a})" in op.label
                    and op.label.startswith(f"{ring.placement} group {list(ring.ranks)[:4]}") and ": " in op.label]
            assert [x.rsplit(") ", 1)[-1] for x in mine] == ["to heads: pack", "to heads: unpack", "to tokens: pack",
                                                             "to tokens: unpack"]
    for charges in ("zeppelin", "te", "none"):
        for engine in ("runtime", "fill"):
            assert simulate(plan, cost, charges=charges, engine=engine, keep_events=False).layer_ms > 0
    assert simulate(plan, cost, head_parallel=False, keep_events=False).layer_ms > 0
