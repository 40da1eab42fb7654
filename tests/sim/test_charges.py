"""The simulator's device-memory charges (sim/charges.py), HBM bandwidth in the profile, the ring-block
fit by orientation, and planning run ahead of the step in the data pipeline. Hand-computed cases."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Sequence

import pytest

from zeppelin_megatron.planner import Cluster, CostModel, StepPlan, load_model
from zeppelin_megatron.planner.lowering import RingCall, lower
from zeppelin_megatron.planner.model import ModelShape
from zeppelin_megatron.planner.profile import ProfileError, default_profile, parse_profile
from zeppelin_megatron.sim.charges import (
    charges_for, hbm_ms, merge_bytes, remap_gathers, shape_of, te_ring_bytes, te_step_bytes, zeppelin_call_bytes,
    zeppelin_local_bytes, zeppelin_remap_bytes, zeppelin_ring_bytes,
)
from zeppelin_megatron.sim.peer_programs import CHARGE_LABELS
from zeppelin_megatron.sim.planbuild import build_plan
from zeppelin_megatron.sim.program import build_layer_program
from zeppelin_megatron.sim.simulator import link_capacities, simulate
from zeppelin_megatron.sim.strategies import plan_with

GB = 1e9


def _cluster(nodes: int, gpus: int) -> Cluster:
    return Cluster(nodes=nodes, gpus_per_node=gpus, nics_per_node=gpus, gpu_nic=tuple(range(gpus)),
                   nvlink_GBps=400.0, nic_Gbps=400.0, tokens_per_gpu=1 << 20, nvlink_latency_us=5.0,
                   nic_latency_us=10.0)


def _cost(cluster: Cluster, layers: int = 1) -> CostModel:
    return CostModel(model=replace(load_model(None), layers=layers), cluster=cluster)  # Llama-7B, MHA


# -- HBM bandwidth in the profile --------------------------------------------------------------------------

def test_bundled_profile_carries_the_measured_h100_copy_bandwidth() -> None:
    p = default_profile()
    assert (p.hbm_GBps, p.hbm_source) == (2951.7, "measured")  # calibration device_to_device_copy_GBps
    assert parse_profile(json.loads(p.to_json())).hbm_GBps == 2951.7


def test_profile_without_hbm_gets_the_datasheet_figure_or_a_clear_error() -> None:
    doc = default_profile().to_dict()
    del doc["hbm"]
    p = parse_profile(doc)
    assert (p.hbm_GBps, p.hbm_source) == (3350.0, "datasheet")  # H100 SXM5 HBM3
    doc["device"] = "Mystery GPU 9000"
    with pytest.raises(ProfileError, match=r"Mystery GPU 9000.*'hbm'|no 'hbm' section.*Mystery GPU 9000"):
        parse_profile(doc)
    doc = default_profile().to_dict()
    doc["hbm"] = {"GBps": 3000.0, "source": "guessed"}
    with pytest.raises(ProfileError, match="guessed"):
        parse_profile(doc)
    doc["hbm"] = {"GBps": -1, "source": "measured"}
    with pytest.raises(ProfileError, match="GBps"):
        parse_profile(doc)


def test_zeppelin_profile_measures_hbm_bandwidth() -> None:
    torch = pytest.importorskip("torch")
    from zeppelin_megatron.measure.profiler import ProfileOptions, measure_profile

    m = ModelShape(layers=2, hidden=64, q_heads=4, kv_heads=2, ffn=128, head_dim=16)
    doc = measure_profile(ProfileOptions(model=m, lengths=(4, 8), linear_tokens=(8,), tokens_per_call=16,
                                         dtype=torch.float32, dtype_name="fp32", device=torch.device("cpu"),
                                         repeats=2, warmup=0, blocks=False, hbm_bytes=1 << 22))
    p = parse_profile(doc)
    assert p.hbm_source == "measured" and 0.1 < p.hbm_GBps < 10_000


# -- merges and copies, counted by hand ------------------------------------------------------------------

def test_merge_bytes_by_hand() -> None:
    sh = shape_of(_cost(_cluster(1, 2)))  # Hq = 32, D = 128: Eq = 4096; bf16 (b = 2), fp32 merges (a = 4)
    # fused (runtime/kernels/fused_merge_triton.py, the engine's path on CUDA with Triton): read out (4) and
    # out_b (2), write out (4) = 10 B per element; read lse (4), lse_b (4), write lse (4) = 12 B per lse value
    assert merge_bytes(sh, 4096, late=False) == 4096 * 4096 * 10 + 4096 * 32 * 12
    # the torch path (ring.merge_lse_ on CPU or without Triton): out_b.to (r2 w4) + out.lerp_(out_b, w)
    # (r4 r4 w4) = 18 B per element; sub 12 + sigmoid_ 8 + logaddexp(out=lse) 12 + lerp_'s broadcast read of
    # w 4 = 36 B per lse value
    assert merge_bytes(sh, 4096, late=False, fused=False) == 4096 * 4096 * 18 + 4096 * 32 * 36
    # the ring's first late call: gather out (8) and lse (8) rows, written back once (8 + 8) at its end
    assert merge_bytes(sh, 4096, late=True) == 4096 * 4096 * (10 + 16) + 4096 * 32 * (12 + 16)
    assert merge_bytes(sh, 4096, late=True, fused=False) == 4096 * 4096 * (18 + 16) + 4096 * 32 * (36 + 16)
    # 169 MB -> 0.0574 ms at 2951.7 GB/s (the module docstring's example; torch path 307 MB, 0.104 ms;
    # out of place, before that: 578 MB, 0.196 ms)
    cost = _cost(_cluster(1, 2))
    assert hbm_ms(cost, merge_bytes(sh, 4096, late=False)) == pytest.approx(0.05737, abs=1e-5)
    assert hbm_ms(cost, merge_bytes(sh, 4096, late=False, fused=False)) == pytest.approx(0.1039, abs=1e-4)
    # fp32 training: no cast of out_b; fused 12 B per element, 12 per lse value; torch 12 and 36
    sh32 = shape_of(CostModel(model=load_model(None), cluster=_cluster(1, 2),
                              profile=replace(default_profile(), dtype_bytes=4)))
    assert (sh32.a, sh32.b) == (4, 4)
    assert merge_bytes(sh32, 10, late=False) == 10 * 4096 * 12 + 10 * 32 * 12
    assert merge_bytes(sh32, 10, late=False, fused=False) == 10 * 4096 * 12 + 10 * 32 * 36
    # float64 accumulators: the engine has no fused path (fused_merge.unavailable_reason), torch's 24 and 72 B
    sh64 = shape_of(CostModel(model=load_model(None), cluster=_cluster(1, 2),
                              profile=replace(default_profile(), dtype_bytes=8)))
    assert (sh64.a, sh64.b) == (8, 8)
    assert merge_bytes(sh64, 10, late=False) == merge_bytes(sh64, 10, late=False, fused=False) == \
        10 * 4096 * 24 + 10 * 32 * 72


def _hand_ring_bytes(position: int) -> float:
    """One 16384-token sequence on a 2-GPU ring, Llama-7B bf16: Eq = 4096, Ekv = 8192, Hq = 32, n = 8192.
    Each rank's ring rows are one range of its buffer (rank 0: chunks 0 | 3, rank 1: 1 | 2): q and dout are
    views, the results are cast straight into their slices."""
    eq, ekv, hq, n = 4096, 8192, 32, 8192
    setup = (2 * 2 * n * ekv + n * eq * (4 + 2)                                # fwd K/V send buffer; result cast
             + 2 * 2 * n * ekv + 4 * n * eq                                    # bwd K/V send buffer; dq zeros
             + n * (eq + ekv) * (4 + 2))                                       # final dq/dk/dv cast into slices
    diag = (n * eq * 6                                                         # o.to(fp32)
            + n * eq * 10 + 8 * n * hq + n * ekv * 6)                          # dq +=, lse copy, acc = block
    if position == 0:  # step 1 is 'late': 4096 late rows against all 8192 of position 1
        tq, tk = 4096, 8192
        step1 = (tq * eq * 10 + 12 * tq * hq + tq * (16 * eq + 16 * hq)        # fused merge on late rows
                 + 2 * 2 * tq * eq                                             # q rows gathered
                 + 2 * tq * (3 * 2 * eq + 4 * hq)                              # bwd (dout, q, out, lse) rows, once
                 + tq * eq * 18 + 8 * tq * hq + tk * ekv * 10)                 # dq .to + index_add, lse, acc +=
    else:  # step 1 is 'early': all 8192 rows against position 0's 4096 early rows
        tq, tk = 8192, 4096
        step1 = (tq * eq * 10 + 12 * tq * hq                                   # fused merge
                 + 2 * 2 * tk * ekv * 2                                        # K/V rows gathered, fwd and bwd
                 + tq * eq * 10 + 8 * tq * hq + tk * ekv * 18)                 # dq +=, lse, .to + index_add_
    return setup + diag + step1


def test_one_ring_pays_its_merges_and_copies_by_hand() -> None:
    cl = _cluster(1, 2)
    cost = _cost(cl, layers=3)
    plan = build_plan([16384], [(0, 1)], cl, cost)
    low = lower(plan)
    sh = shape_of(cost)
    for r in (0, 1):
        calls = [op for op in low.ranks[r].forward if isinstance(op, RingCall)]
        got = zeppelin_ring_bytes(sh, 8192, contiguous=True) + sum(
            zeppelin_call_bytes(sh, c, first_late=c.kind == "late") for c in calls)
        assert got == _hand_ring_bytes(r)
    # The whole layer: linear/2, remap copies/2, [diag, copies of step 0] against the K/V transfer
    # (4x the forward K/V bytes: the dK/dV accumulator is fp32), [step 1's block, its copies], the rest.
    res = simulate(plan, cost)
    o = cost.call_overhead_ms
    diag, _ = cost.ring_compute_profile(16384, 2)
    nvl, _ = link_capacities(cost)
    comm = 5e-3 + 4 * cost.ring_step_bytes(16384, 2) / nvl
    lin = cost.linear_ms(8192)
    f_in, f_out, b = 4096 + 8192, 4096, 2
    # 4 remap_parts: the linear layout is the attention layout here (rank 0: chunks 0 | 3, rank 1: 1 | 2),
    # every row stays: nothing enters a send buffer and each destination is its (contiguous) source
    remap = 0
    assert zeppelin_remap_bytes(sh, plan) == [remap, remap] and not plan.remap.moves()
    # the same plan with rank 0's two ranges swapped in its linear layout: one reordering gather per part
    swapped = replace(plan, linear_layout=(plan.linear_layout[0][::-1], plan.linear_layout[1]))
    assert zeppelin_remap_bytes(sh, swapped) == [2 * (2 * b * f_in * 8192 + 2 * b * f_out * 8192), 0]  # index_select
    assert remap_gathers(swapped, "to_attention")[0].rows_read() == (0, 8192)
    ring = zeppelin_ring_bytes(sh, 8192, contiguous=True)
    step0 = {0: 6 * 8192 * 4096 + ring, 1: 6 * 8192 * 4096 + ring}
    blocks = {0: cost.block_fitted_ms(4096, 8192), 1: cost.block_fitted_ms(8192, 4096)}  # late: wide, early: tall
    finish = []
    for r in (0, 1):
        start = lin / 2 + hbm_ms(cost, remap) / 2
        rest = hbm_ms(cost, _hand_ring_bytes(r) - step0[r])
        finish.append(max(start + max(diag, o) + hbm_ms(cost, step0[r]), start + comm)
                      + max(blocks[r], o) + rest + hbm_ms(cost, remap) / 2 + lin / 2)
    assert res.layer_ms == pytest.approx(max(finish), rel=1e-9)
    assert res.step_ms == pytest.approx(3 * max(finish), rel=1e-9)
    assert res.layer_ms > simulate(plan, cost, charges="none").layer_ms


@pytest.mark.parametrize("g", [2, 4, 8])
def test_a_ring_of_g_steps_pays_g_minus_1_merges(g: int) -> None:
    cl = _cluster(1, g)
    cost = _cost(cl)
    plan = build_plan([4096 * g], [tuple(range(g))], cl, cost)
    low = lower(plan)
    prog = build_layer_program(plan, cost)
    sh = shape_of(cost)
    for r in range(g):
        calls = [op for op in low.ranks[r].forward if isinstance(op, RingCall)]
        merges = [c for c in calls if c.kind != "diag"]
        assert len(merges) == g - 1
        copies = [op for op in prog.ops[r] if op.kind == "copy" and "merges" in op.label]
        assert len(copies) == g  # one per call (the diagonal's: its fp32 start and the ring's gathers)
        first_late = next((d for d in calls if d.kind == "late"), None)
        assert all(d.kind == "late" for d in calls[calls.index(first_late):]) if first_late else True
        for c, op in zip(calls[1:], copies[1:]):  # every later call pays at least its merge
            assert op.ms >= hbm_ms(cost, merge_bytes(sh, sum(c.lens_q), late=c is first_late))
        ring = zeppelin_ring_bytes(sh, 4096, contiguous=True)  # one sequence: each rank's rows are one range
        assert sum(op.ms for op in copies) == pytest.approx(hbm_ms(cost, ring + sum(
            zeppelin_call_bytes(sh, c, first_late=c is next((d for d in calls if d.kind == "late"), None))
            for c in calls)), rel=1e-12)


def test_contiguous_rows_drop_the_gathers_by_hand() -> None:
    """Per ring (n rows) and per local call (T tokens), Llama-7B bf16 (Eq 4096, Ekv 8192, a 4, b 2):
    gathered rows pay index_select and .to + index_copy_; rows in one range only the K/V send buffer,
    the dq zeros and the casts into the slices (ring), the slice writes (local)."""
    sh = shape_of(_cost(_cluster(1, 2)))
    eq, ekv, n = 4096, 8192, 3
    assert zeppelin_ring_bytes(sh, n) == (2 * 2 * n * (eq + ekv) + n * eq * (4 + 6)
                                          + 2 * 2 * n * (2 * eq + ekv) + 4 * n * eq + n * (eq + ekv) * (4 + 6))
    assert zeppelin_ring_bytes(sh, n, contiguous=True) == (2 * 2 * n * ekv + n * eq * (4 + 2)
                                                           + 2 * 2 * n * ekv + 4 * n * eq + n * (eq + ekv) * (4 + 2))
    assert zeppelin_ring_bytes(sh, 1) == 294_912 and zeppelin_ring_bytes(sh, 1, contiguous=True) == 180_224
    assert zeppelin_local_bytes(sh, n) == n * 2 * 2 * (eq + ekv) + n * 2 * 2 * eq \
        + n * 2 * 2 * (2 * eq + ekv) + n * 2 * 2 * (eq + ekv)
    assert zeppelin_local_bytes(sh, n, contiguous=True) == n * 2 * 2 * eq + n * 2 * 2 * (eq + ekv)
    assert zeppelin_local_bytes(sh, 1) == 180_224 and zeppelin_local_bytes(sh, 1, contiguous=True) == 65_536


def test_the_simulator_charges_gathers_only_where_rows_are_not_contiguous() -> None:
    """Sequences 0 and 2 on a ring over ranks 0 and 1, sequence 1 local on rank 0. By index (build_plan's
    order) rank 0's ring rows are split by sequence 1's: gathered; in engine order (plan_step's) every
    rank's ring rows are one range (a local call of one sequence is one range in both). Rank 0's copies
    differ by exactly the ring's gathers; rank 1 (one range either way) pays the same."""
    from zeppelin_megatron.planner.api import engine_order

    cl = _cluster(1, 2)
    cost = _cost(cl)
    by_index = build_plan([4096, 1000, 4096], [(0, 1), (0,), (0, 1)], cl, cost, local_slots=False)
    ordered = engine_order(by_index)
    assert by_index.attention_layout[0] == ((0, 0, 1024), (0, 3072, 4096), (1, 0, 1000), (2, 0, 1024),
                                            (2, 3072, 4096))
    assert ordered.attention_layout[0] == ((0, 0, 1024), (0, 3072, 4096), (2, 0, 1024), (2, 3072, 4096),
                                           (1, 0, 1000))
    sh = shape_of(cost)

    def copies(plan: StepPlan) -> list[float]:
        prog = build_layer_program(plan, cost)
        return [sum(op.ms for op in ops if op.kind == "copy" and "remap" not in op.label) for ops in prog.ops]

    spans = {p: [part.span for prog in lower(p).ranks for part in prog.rings] for p in (by_index, ordered)}
    assert spans[by_index] == [None, (0, 4096)] and spans[ordered] == [(0, 4096), (0, 4096)]
    a, b = copies(by_index), copies(ordered)
    assert [c.span for c in lower(by_index).ranks[0].local_chunks] == [(2048, 3048)]
    saved = zeppelin_ring_bytes(sh, 4096) - zeppelin_ring_bytes(sh, 4096, contiguous=True)
    assert a[0] - b[0] == pytest.approx(hbm_ms(cost, saved), rel=1e-9)
    assert a[1] == pytest.approx(b[1], rel=1e-12)


def test_a_ringless_rank_without_a_remap_pays_no_local_copies() -> None:
    """Sequence 0 on a ring over ranks 0 and 1, sequences 1 and 2 local on ranks 0 and 2, no remap (linear layout =
    attention layout), engine order: rank 2's one local call covers its whole buffer (``whole_chunk``): no copy
    op, and predict charges none either; rank 0's local call beside its ring pays its contiguous copies."""
    from zeppelin_megatron.planner.api import engine_order
    from zeppelin_megatron.planner.predict import predict

    cl = _cluster(1, 4)
    cost = _cost(cl)
    plan = engine_order(build_plan([4096, 1000, 3000, 500], [(0, 1), (0,), (2,), (3,)], cl, cost,
                                   local_slots=False, remap=False))
    assert plan.linear_layout == plan.attention_layout
    progs = lower(plan).ranks
    assert [p.whole_chunk for p in progs] == [None, None, 0, 0]
    prog = build_layer_program(plan, cost)
    local_copies = [[op.ms for op in ops if op.kind == "copy" and op.label == "local call row copies"]
                    for ops in prog.ops]
    sh = shape_of(cost)
    assert local_copies[0] == [pytest.approx(hbm_ms(cost, zeppelin_local_bytes(sh, 1000, contiguous=True)))]
    assert local_copies[2] == [] and local_copies[3] == []
    charged, bare = predict(plan, cost, charges="zeppelin"), predict(plan, cost, charges="none")
    assert charged.attention_ms[2] == pytest.approx(bare.attention_ms[2], rel=1e-12)  # no copies on rank 2
    assert charged.attention_ms[0] > bare.attention_ms[0]


def test_a_remap_pays_its_gathers_and_a_routed_remap_its_staging() -> None:
    sh = shape_of(_cost(_cluster(1, 2)))
    b, f_in, f_out = 2, 4096 + 8192, 4096
    cl = _cluster(2, 2)
    cost = _cost(cl)
    base = plan_with("zeppelin-no-packed", [9000, 3000, 2000, 1500, 800, 700], cl, cost).plan  # remaps
    plain = zeppelin_remap_bytes(sh, replace(base, remap_proxies=()))
    routed = zeppelin_remap_bytes(sh, replace(base, remap_proxies=(0, 1)))
    for r in range(4):
        t_lin, t_att = base.tokens(r, "linear"), base.tokens(r, "attention")
        # direct: send gathers, and at most one index_select + index_copy_ per destination row and part
        low = 2 * b * (f_in + f_out) * (t_lin + t_att)
        assert low <= plain[r] <= low + 2 * b * (f_in + f_out) * (t_lin + t_att)
        # routed: the phases' gathers of the rows that move again, well below the old staging copies
        # (three index_select + cat of every staged row, 12 b F' T_src per remap)
        staging = sum(12 * b * f * src for f, src in ((f_in, t_lin), (f_out, t_att), (f_out, t_lin), (f_in, t_att)))
        assert plain[r] < routed[r] < plain[r] + staging
    # rows by hand for rank 0 of the 2-GPU ring (to_attention): none sent (every row stays), 8192 kept,
    # read as the source itself
    ring = build_plan([16384], [(0, 1)], _cluster(1, 2), _cost(_cluster(1, 2)))
    (g0, _) = remap_gathers(ring, "to_attention")
    assert g0.sizes == (0, 0, 8192) and g0.phases == () and g0.final == ((-1, None, None),)
    # In a layer program: remap copies before and after attention on every rank; the rows of in-place chunks
    # (local sequences whole on their rank in both layouts, run on the linear rows) are gathered neither way.
    cl = _cluster(2, 2)
    cost = _cost(cl)
    sp = plan_with("zeppelin-no-packed", [9000, 3000, 2000, 1500, 800, 700], cl, cost)  # remaps
    prog = build_layer_program(sp.plan, cost)
    low = lower(sp.plan)
    want = zeppelin_remap_bytes(sh, sp.plan, low.ranks)
    every = zeppelin_remap_bytes(sh, sp.plan)
    for r in range(4):
        n = sum(sum(c.lens) for c in low.ranks[r].local_chunks if c.linear_rows is not None)
        assert (want[r] < every[r]) if n else (want[r] == every[r]), r
    assert any(c.linear_rows is not None for p in low.ranks for c in p.local_chunks)
    for r in range(4):
        rc = [op.ms for op in prog.ops[r] if op.kind == "copy" and op.label.startswith("remap")]
        assert len(rc) == 2 and sum(rc) == pytest.approx(hbm_ms(cost, want[r]), rel=1e-12)
    none = build_layer_program(sp.plan, cost, charges="none")
    assert not any(op.kind == "copy" for ops in none.ops for op in ops)


def test_baselines_pay_te_cp_corrections_on_their_rings_only() -> None:
    assert [charges_for(n) for n in ("zeppelin", "zeppelin-no-remap", "te-cp", "megatron-hcp", "distca")] == \
        ["zeppelin", "zeppelin", "te", "te", "te"]
    cl = _cluster(2, 4)
    cost = _cost(cl)
    sh = shape_of(cost)
    plan = build_plan([32768], [tuple(range(8))], cl, cost)  # a TE CP ring of 8 over both nodes
    prog = build_layer_program(plan, cost, charges="te")
    low = lower(plan)
    for r in range(8):
        copies = [op for op in prog.ops[r] if op.kind == "copy"]
        calls = [op for op in low.ranks[r].forward if isinstance(op, RingCall)]
        # no gathers, no remap copies: one copy op per call, the ring's buffers (TE's torch.cat of K and V, the
        # output's zeros, backward's K/V buffer) with the diagonal's charges, then every other step's
        assert len(copies) == len(calls) == 8 and calls[0].kind == "diag"
        n = calls[0].part.tokens(calls[0].position)
        assert n == 32768 // 8
        assert [op.ms for op in copies] == pytest.approx(
            [hbm_ms(cost, te_step_bytes(sh, sum(c.lens_q), sum(c.lens_k), c.kind) + (te_ring_bytes(sh, n) if j == 0
                                                                                    else 0.0))
             for j, c in enumerate(calls)], rel=1e-12)
    # Megatron HCP's TE ring (peer program): g - 1 corrections per member; DistCA (one call per nano-batch): none.
    lens = [30000, 2000, 1000, 500]
    hcp = plan_with("megatron-hcp", lens, cl, cost)
    hp = build_layer_program(hcp.plan, cost, hcp.attention_comm)
    ring_members = [r for r in range(8) if any("step 1" in op.label for op in hp.ops[r] if op.kind == "attention")]
    assert ring_members
    for r in ring_members:
        steps = [op for op in hp.ops[r] if op.kind == "attention" and " step " in op.label]
        fixes = [op for op in hp.ops[r] if op.kind == "copy" and op.label.endswith("output correction")]
        rings = len({op.label.rsplit(" step ", 1)[0] for op in steps})
        assert len(fixes) == len(steps)  # every step of a ring, the diagonal's too
        assert len([op for op in hp.ops[r] if op.kind == "copy" and op.label.endswith("ring buffers")]) == rings
    bare = build_layer_program(hcp.plan, cost, hcp.attention_comm, charges="none")
    assert not any(op.label.endswith(CHARGE_LABELS) for ops in bare.ops for op in ops)
    dc = plan_with("distca", lens, cl, cost)  # its own buffer packing stays ('copy' ops of sim/distca.py)
    assert not any(op.label.endswith("output correction")
                   for ops in build_layer_program(dc.plan, cost, dc.attention_comm).ops for op in ops)


@pytest.mark.parametrize("name", ["zeppelin", "te-cp", "megatron-hcp", "te-cp-a2a-p2p", "distca", "flexsp"])
def test_every_kernel_call_pays_at_least_the_call_overhead(name: str) -> None:
    cl = _cluster(2, 4)
    cost = _cost(cl)
    sp = plan_with(name, [20000, 6000, 3000, 900, 400, 300, 200, 100], cl, cost)
    prog = build_layer_program(sp.plan, cost, sp.attention_comm, charges=charges_for(name))
    calls = [op for ops in prog.ops for op in ops if op.what == "compute" and op.kind in ("attention", "local")]
    assert calls and all(op.ms >= cost.call_overhead_ms for op in calls)


# -- ring-block cost fitted to the measured blocks --------------------------------------------------------

def test_ring_block_fit_by_orientation_before_and_after() -> None:
    """Error of the block cost against the profile's measured ring blocks (MHA, 32 heads x 128).

    in sample: area-averaged ``block_ms`` -10.2% / +10.2% at 128x64 / 64x128 (512 blocks), max |err|
    10.2%; ``block_fitted_ms`` 0.0% (it interpolates the measured rows of each orientation).
    leave one out (inner rows, each predicted from the others): max |err| 9.4% before, 6.3% after.
    """
    p = default_profile()
    mha = ModelShape(layers=1, hidden=4096, q_heads=32, kv_heads=32, ffn=11008, head_dim=128)
    cost = CostModel(model=mha, cluster=_cluster(1, 8))

    def err(c: CostModel, r: object, fitted: bool) -> float:
        f = c.block_fitted_ms if fitted else c.block_ms
        return f(r.q_len, r.k_len) * r.num_seqs / r.fwd_bwd_ms - 1  # type: ignore[attr-defined]

    before = [err(cost, r, False) for r in p.blocks]
    after = [err(cost, r, True) for r in p.blocks]
    assert max(map(abs, before)) == pytest.approx(0.102, abs=0.001)
    assert max(map(abs, after)) < 1e-9
    loo_before, loo_after = [], []
    for i, r in enumerate(p.blocks[2:-2], start=2):
        c = CostModel(model=mha, cluster=_cluster(1, 8),
                      profile=replace(p, blocks=tuple(b for j, b in enumerate(p.blocks) if j != i)))
        loo_before.append(abs(err(c, r, False)))
        loo_after.append(abs(err(c, r, True)))
    assert max(loo_after) < max(loo_before)
    assert max(loo_before) == pytest.approx(0.094, abs=0.001) and max(loo_after) == pytest.approx(0.063, abs=0.001)
    # A zigzag step's tall block (early call, 2c x c) costs more than its wide one (late call, c x 2c) at
    # small c, which the area-averaged model hides: the ring waits for its slowest member.
    assert cost.block_fitted_ms(128, 64) > cost.block_ms(128, 64) > cost.block_fitted_ms(64, 128)


# -- planning time: hidden by the data pipeline's prefetch thread -----------------------------------------

def test_plan_of_the_next_micro_step_is_computed_while_the_current_one_trains(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.megatron_data.conftest import SEQ_LENGTH, random_documents, write_indexed
    from zeppelin_megatron import plan_step
    from zeppelin_megatron.megatron.data.indexed import DocumentDataset
    from zeppelin_megatron.megatron.data.iterator import ZeppelinDataIterator
    from zeppelin_megatron.megatron.data.sampler import TokenBudgetSampler

    docs, items = random_documents(3, 40, seq_length=SEQ_LENGTH)
    dataset = DocumentDataset(prefix=write_indexed(tmp_path / "d", docs, items=items), seq_length=SEQ_LENGTH)
    small = ModelShape(layers=2, hidden=256, q_heads=4, kv_heads=4, ffn=512)
    cost = CostModel(model=small, cluster=Cluster(nodes=2, gpus_per_node=2, nics_per_node=2, gpu_nic=(0, 1),
                                                  nvlink_GBps=450.0, nic_Gbps=400.0, tokens_per_gpu=4 * SEQ_LENGTH))
    log: list[tuple[str, float, float]] = []
    plan = partial(plan_step, cost_model=cost)

    def planner(lengths: Sequence[int]):  # -> StepPlan; records which thread planned, and when
        t0 = time.perf_counter()
        time.sleep(0.05)  # stands in for the planner's 40-50 ms at 1M tokens / 128 GPUs
        out = plan(lengths)
        log.append((threading.current_thread().name, t0, time.perf_counter()))
        return out

    sampler = TokenBudgetSampler(lengths=dataset.lengths, budget=4 * SEQ_LENGTH * 2, seed=5)
    with ZeppelinDataIterator(dataset=dataset, sampler=sampler, planner=planner, rank=0, prefetch_depth=1) as it:
        first = next(it)
        train_start = time.perf_counter()
        time.sleep(1.0)  # micro-step 0 "trains" (long enough for a loaded 2-core machine)
        train_end = time.perf_counter()
        t = time.perf_counter()
        second = next(it)
        waited = time.perf_counter() - t
    assert (first.step, second.step) == (0, 1)
    assert all(name == "zeppelin-data-rank0" for name, _, _ in log)  # never the training thread
    step1 = log[1]
    assert step1[1] < train_end and step1[2] < train_end  # planned while micro-step 0 trained
    assert train_start < train_end and waited < 0.2       # the training thread did not plan or wait for it
