"""The planner prices what the engine pays (planner/engine_ring.py, engine_costs.py, predict.py): each new
cost term by hand, the planner's charges against the simulator's op for op, and predictions against
simulated steps on fixed plans."""

from __future__ import annotations

from dataclasses import replace

import pytest

import zeppelin_megatron.sim.charges as sim_charges
from zeppelin_megatron.planner import Cluster, CostModel, load_model
from zeppelin_megatron.planner import engine_costs, peer_costs
from zeppelin_megatron.planner.engine_costs import (
    Shape, call_bytes, hbm_ms, merge_bytes, shape_of, wire_factor, zeppelin_ring_bytes,
)
from zeppelin_megatron.planner.peer_costs import te_ring_bytes, te_step_bytes
from zeppelin_megatron.planner.engine_ring import local_copy_ms_per_token, ring_steps
from zeppelin_megatron.planner.predict import predict, ring_time
from zeppelin_megatron.sim.planbuild import build_plan
from zeppelin_megatron.sim.program import build_layer_program
from zeppelin_megatron.sim.simulator import simulate

SH = Shape(eq=4096, ekv=8192, hq=32, b=2, a=4)  # Llama-7B, bf16, fp32 accumulators


def _cluster(nodes: int, gpus: int) -> Cluster:
    return Cluster(nodes=nodes, gpus_per_node=gpus, nics_per_node=gpus, gpu_nic=tuple(range(gpus)),
                   nvlink_GBps=400.0, nic_Gbps=400.0, tokens_per_gpu=1 << 20, nvlink_latency_us=5.0,
                   nic_latency_us=10.0)


def _cost(nodes: int = 1, gpus: int = 8, layers: int = 1) -> CostModel:
    return CostModel(model=replace(load_model(None), layers=layers), cluster=_cluster(nodes, gpus))


# -- one derivation ------------------------------------------------------------------------------------------

def test_simulator_charges_are_the_planner_formulas() -> None:
    """sim/charges.py re-exports planner/engine_costs.py and planner/peer_costs.py: the same functions, not copies."""
    for name in ("hbm_ms", "shape_of", "merge_bytes", "call_bytes", "zeppelin_call_bytes", "wire_factor",
                 "zeppelin_ring_bytes", "zeppelin_local_bytes", "zeppelin_remap_bytes", "a2a_token_bytes",
                 "zeppelin_a2a_bytes"):
        assert getattr(sim_charges, name) is getattr(engine_costs, name), name
    for name in peer_costs.__all__:
        assert getattr(sim_charges, name) is getattr(peer_costs, name), name


# -- each cost term by hand ----------------------------------------------------------------------------------

def test_wire_factor_counts_the_fp32_accumulator() -> None:
    assert wire_factor(SH) == 4.0  # K/V forward 2 + K/V backward 2 + dK/dV in fp32 4 = 8 B per 2 B element
    assert wire_factor(SH, "te") == wire_factor(SH, "none") == 3.0
    assert wire_factor(Shape(eq=1, ekv=2, hq=1, b=4, a=4)) == 3.0  # fp32 training: the accumulator is K/V's size


def test_call_bytes_by_hand() -> None:
    # late call, 1 query row, 2 key rows, not the first late: merge (fused) 4096 * 10 + 32 * 12 = 41 344;
    # backward dq .to + index_add_ 4096 * 18 = 73 728, lse 2 * 4 * 32 = 256, dK/dV in place 2 * 8192 * 10
    assert call_bytes(SH, "late", 1, 2, kv_all=True, first_late=False) == 41344 + 73728 + 256 + 163840
    # the first late call adds the held out/lse gather + write back (4 * 4 * (4096 + 32)), the held q rows
    # (2 * 2 * 4096) and the backward (dout, q, out, lse) gathers (2 * (3 * 2 * 4096 + 4 * 32))
    extra = 4 * 4 * (4096 + 32) + 2 * 2 * 4096 + 2 * (3 * 2 * 4096 + 4 * 32)
    assert call_bytes(SH, "late", 1, 2, kv_all=True, first_late=True) == 41344 + 73728 + 256 + 163840 + extra
    # diagonal, 2 rows: o.to(fp32) 2 * 4096 * 6, dq 2 * 4096 * 10, lse 2 * 2 * 4 * 32, dK/dV copy 2 * 8192 * 6
    assert call_bytes(SH, "diag", 2, 2, kv_all=True, first_late=False) == 49152 + 81920 + 512 + 98304
    with pytest.raises(ValueError, match="'side'.*diag, early or late"):
        call_bytes(SH, "side", 1, 1, kv_all=True, first_late=False)


def test_ring_steps_terms_by_hand() -> None:
    """One 4096-token sequence on 4 positions: chunk c = 512, pair 1024."""
    cost = _cost()
    sh, o = shape_of(cost), cost.call_overhead_ms
    st = ring_steps(cost, [4096], 4)
    diag = max(cost.ring_compute_profile(4096, 4)[0], o)
    ring = zeppelin_ring_bytes(sh, 1024)
    assert st.diag == pytest.approx(diag + hbm_ms(cost, call_bytes(sh, "diag", 1024, 1024, kv_all=True,
                                                                   first_late=False) + ring))
    early_c = hbm_ms(cost, call_bytes(sh, "early", 1024, 512, kv_all=False, first_late=False))
    late_c = hbm_ms(cost, call_bytes(sh, "late", 512, 1024, kv_all=True, first_late=False))
    assert st.early == pytest.approx(max(cost.block_fitted_ms(1024, 512), o) + early_c)
    assert st.late == pytest.approx(max(cost.block_fitted_ms(512, 1024), o) + late_c)
    assert st.off == max(st.early, st.late)
    # first late: the merge's held rows (4 a (Eq + Hq) per row), q rows (2 b Eq), backward gathers
    first = 512 * (4 * 4 * (4096 + 32) + 2 * 2 * 4096 + 2 * (3 * 2 * 4096 + 4 * 32))
    assert st.first_late == pytest.approx(hbm_ms(cost, first))
    assert st.wire_bytes == 4 * 1024 * cost.kv_bytes_per_token  # 2 + a/b = 4x the forward chunk pair
    # ring bytes by hand: forward 2 * 2 * 1024 * 12288 + 1024 * 4096 * 10, backward 4 * 1024 * 16384
    # + 4 * 1024 * 4096 + 1024 * 12288 * 10
    assert ring == 50331648 + 41943040 + 67108864 + 16777216 + 125829120


@pytest.mark.parametrize("lengths, g, a2a", [([4096], 4, 1), ([70001, 333, 12345], 8, 1), ([99999], 1, 8),
                                              ([65536, 4097], 2, 4), ([5000], 4, 2)])
def test_ring_steps_charges_are_call_bytes_exactly(lengths: list[int], g: int, a2a: int) -> None:
    """ring_steps prices the calls from per-row byte rates (engine_ring._zeppelin_bytes, memoised): call_bytes'
    own sums to the last bit; and a head-parallel ring's all-to-all copies are zeppelin_a2a_bytes' own."""
    from zeppelin_megatron.planner.cost_heads import head_ring_time
    from zeppelin_megatron.planner.engine_costs import ulysses_call_bytes, zeppelin_a2a_bytes
    from zeppelin_megatron.planner.zigzag import ring_chunk_pair_tokens, ring_max_tokens

    cost = _cost()
    sh, o = shape_of(cost, a2a), cost.call_overhead_ms
    pairs = [ring_chunk_pair_tokens(s, g) for s in lengths]
    chunks = [-(-s // (2 * g)) for s in lengths]
    pair, chunk = sum(pairs), sum(chunks)
    st = ring_steps(cost, lengths, g, a2a=a2a)
    diag = (ulysses_call_bytes(sh, pair) if a2a > 1 and g == 1 else
            call_bytes(sh, "diag", pair, pair, kv_all=True, first_late=False)
            + (zeppelin_ring_bytes(sh, pair) if a2a == 1 else 0.0))
    assert st.diag == max(sum(cost.ring_compute_profile(s, g)[0] for s in lengths) / a2a, o) + hbm_ms(cost, diag)
    if g > 1:
        early_k = sum(cost.block_fitted_ms(p, c) for p, c in zip(pairs, chunks)) / a2a
        late_k = sum(cost.block_fitted_ms(c, p) for p, c in zip(pairs, chunks)) / a2a
        late = hbm_ms(cost, call_bytes(sh, "late", chunk, pair, kv_all=True, first_late=False))
        assert st.early == max(early_k, o) + hbm_ms(cost, call_bytes(sh, "early", pair, chunk, kv_all=False,
                                                                      first_late=False))
        assert st.late == max(late_k, o) + late
        assert st.first_late == hbm_ms(cost, call_bytes(sh, "late", chunk, pair, kv_all=True, first_late=True)) - late
    if a2a > 1:  # the ring over one node's first g * a2a GPUs (8 here)
        ranks = tuple(range(g * a2a))
        h = head_ring_time(cost, ranks, lengths, a2a, "zeppelin")
        held = sum(ring_max_tokens(s, len(ranks)) for s in lengths)
        copies = sum(zeppelin_a2a_bytes(shape_of(cost), a2a, held, pair, contiguous=True, blocks=g).values())
        assert h.copy_ms == hbm_ms(cost, copies) + st.copy_ms


def test_ring_steps_te_and_none() -> None:
    cost = _cost()
    sh, o = shape_of(cost), cost.call_overhead_ms
    d, f = cost.ring_compute_profile(4096, 4)
    none = ring_steps(cost, [4096], 4, charges="none")
    assert (none.diag, none.early, none.late, none.first_late, none.copy_ms) == (max(d, o), max(f, o), max(f, o),
                                                                                 0.0, 0.0)
    assert none.wire_bytes == 3 * cost.ring_step_bytes(4096, 4)
    te = ring_steps(cost, [4096], 4, charges="te")
    te_copy = hbm_ms(cost, te_step_bytes(sh, 1024, 512, "early"))
    assert te.early == pytest.approx(max(cost.block_fitted_ms(1024, 512), o) + te_copy)
    buf = hbm_ms(cost, te_ring_bytes(sh, 1024) + te_step_bytes(sh, 1024, 1024, "diag"))  # the ring's buffers, step 0
    assert te.diag == max(d, o) + buf
    assert te.late == pytest.approx(max(cost.block_fitted_ms(512, 1024), o) + hbm_ms(cost, te_step_bytes(sh, 512, 1024,
                                                                                                       "late")))
    assert te.copy_ms == pytest.approx(buf + 3 * max(
        te.early - max(cost.block_fitted_ms(1024, 512), o), te.late - max(cost.block_fitted_ms(512, 1024), o)))
    with pytest.raises(ValueError, match="'tee'"):
        ring_steps(cost, [4096], 4, charges="tee")
    with pytest.raises(ValueError, match="g = 0"):
        ring_steps(cost, [4096], 0)


def test_ring_time_none_is_the_old_rule() -> None:
    """Under ``charges="none"`` a lone sequence's ring costs what CostModel.ring_ms says (the baselines' rule)."""
    cost = _cost()
    total, own, nbytes, _ = ring_time(cost, (0, 1, 2, 3), [65536], {})  # default: "none"
    assert total == pytest.approx(cost.ring_ms(65536, 4, inter_node=False))
    assert nbytes == 3 * cost.ring_step_bytes(65536, 4)
    charged = ring_time(cost, (0, 1, 2, 3), [65536], {}, "zeppelin")
    assert charged[0] > total and charged[2] == 4 * cost.ring_step_bytes(65536, 4)


def test_local_copies_per_token() -> None:
    cost = _cost()
    # forward 2 b (Eq + Ekv) + 2 b Eq, backward 2 b (2 Eq + Ekv) + 2 b (Eq + Ekv) per token
    per = 4 * 12288 + 4 * 4096 + 4 * 16384 + 4 * 12288
    assert local_copy_ms_per_token(cost) == pytest.approx(per / (cost.profile.hbm_GBps * 1e6))
    assert local_copy_ms_per_token(cost, "te") == 0.0
    assert merge_bytes(SH, 1, late=False) == 41344  # the fused merge W2 charges (kept)


# -- the planner's charges are the simulator's --------------------------------------------------------------

@pytest.mark.parametrize("g,lengths", [(2, [8192]), (4, [16384, 4096]), (8, [65536])])
def test_planner_step_copies_match_the_simulator_ops(g: int, lengths: list[int]) -> None:
    """On a ring over one node, the simulator's copy ops of each rank (lowered calls, sim/program.py) sum to
    what ring_steps charges: step 0 (with the ring's gathers), early and late steps, the first late call.
    Chunks here divide evenly, so the lowered calls have exactly the planner's rows."""
    cost = _cost(1, g)
    plan = build_plan(lengths, [tuple(range(g))] * len(lengths), cost.cluster, cost, local_slots=False)
    st = ring_steps(cost, lengths, g)
    prog = build_layer_program(plan, cost, "ring", charges="zeppelin")
    early_c = st.early - max(sum(cost.block_fitted_ms(2 * (s // (2 * g)), s // (2 * g)) for s in lengths),
                             cost.call_overhead_ms)
    late_c = st.late - max(sum(cost.block_fitted_ms(s // (2 * g), 2 * (s // (2 * g))) for s in lengths),
                           cost.call_overhead_ms)
    diag_c = st.diag - max(sum(cost.ring_compute_profile(s, g)[0] for s in lengths), cost.call_overhead_ms)
    for p in range(g):
        copies = [op.ms for op in prog.ops[p] if op.kind == "copy" and "merges" in op.label]
        late_steps = g - 1 - p  # position p sees an earlier source at steps 1..p (early), later after
        expect = diag_c + p * early_c + late_steps * late_c + (st.first_late if late_steps else 0.0)
        # the planner prices the ring's gathered rows; these rows are one range, which the engine reads as
        # views and the simulator charges so (zeppelin_ring_bytes(..., contiguous=True))
        n = sum(2 * (s // (2 * g)) for s in lengths)
        sh = shape_of(cost)
        expect -= hbm_ms(cost, zeppelin_ring_bytes(sh, n) - zeppelin_ring_bytes(sh, n, contiguous=True))
        assert sum(copies) == pytest.approx(expect, rel=1e-9)


def test_planner_wire_bytes_match_the_simulator_transfers() -> None:
    cost = _cost(1, 4)
    plan = build_plan([16384], [(0, 1, 2, 3)], cost.cluster, cost, local_slots=False)
    prog = build_layer_program(plan, cost, "ring", charges="zeppelin")
    ring = [t for t in prog.transfers.values() if t.category == "ring"]
    assert ring and all(leg.nbytes == ring_steps(cost, [16384], 4).wire_bytes
                        for t in ring for chain in t.chains for leg in chain)


# -- prediction against the simulator -----------------------------------------------------------------------

def test_prediction_tracks_the_simulated_step_on_fixed_plans() -> None:
    """Fixed plans on one node (no remap, no cross-node hops): the predicted step is within 3% of the
    simulated one with the engine's charges (measured at this commit: within 1.5%); without them
    (``charges="none"``) it is 5-10% short."""
    cost = _cost(1, 8, layers=4)
    for lengths, groups in (([65536], [tuple(range(8))]),
                            ([32768, 32768], [(0, 1, 2, 3), (4, 5, 6, 7)]),
                            ([16384] * 4, [(0, 1), (2, 3), (4, 5), (6, 7)])):
        plan = build_plan(lengths, groups, cost.cluster, cost, local_slots=False, with_prediction=False)
        sim = simulate(plan, cost, keep_events=False).step_ms
        assert predict(plan, cost, charges="zeppelin").step_ms == pytest.approx(sim, rel=0.03)
        assert predict(plan, cost).step_ms < 0.97 * sim  # default: charges="none"


def test_remap_copy_bytes_by_hand_and_against_the_exact_count() -> None:
    """``2 b (2 Eq + Ekv) (rows(T_lin, T_att) + rows(T_att, T_lin))``, ``rows(s, d) = (s - K) + 2 (d - K) + K - I``;
    on direct remaps of 32-GPU plans within 0.6-1.25x of the simulator's exact per-rank count (with the lowered
    programs: in-place chunks' rows not copied); 0 where the exact count is."""
    from zeppelin_megatron.planner import load_cluster, plan_step
    from zeppelin_megatron.planner.engine_costs import remap_copy_bytes, zeppelin_remap_bytes
    from zeppelin_megatron.planner.lowering import lower
    from zeppelin_megatron.planner.workloads import long_tailed_batch

    unit = 2 * 2 * (2 * 4096 + 8192)
    assert remap_copy_bytes(SH, 8192, 8192) == unit * 2 * (8192 + 2 * 8192)  # 3.22 GB, none staying
    assert remap_copy_bytes(SH, 8192, 8192, staying=8192) == unit * 2 * 8192  # reordered in place
    # in place: only the q/k/v remap in copies them (their backward reads q/k/v in the attention buffers)
    assert remap_copy_bytes(SH, 8192, 8192, staying=8192, in_place=8192) == 4 * 2 * (4096 + 8192) * 8192
    assert remap_copy_bytes(SH, 8192, 8192, identity=True) == 0
    cost = CostModel(model=load_model(None), cluster=load_cluster("4x8"))
    sh = shape_of(cost)
    for seed in (1, 2):
        plan = plan_step(long_tailed_batch(1 << 20, seed), cost).evolve(remap_proxies=())
        low = lower(plan)
        exact = zeppelin_remap_bytes(sh, plan, low.ranks)
        for r in range(plan.world_size):
            in_place = sum(sum(c.lens) for c in low.ranks[r].local_chunks if c.linear_rows is not None)
            est = remap_copy_bytes(sh, plan.tokens(r, "linear"), plan.tokens(r, "attention"),
                                   staying=int(plan.remap.counts()[r, r]), in_place=in_place,
                                   identity=in_place == 0 and plan.linear_layout[r] == plan.attention_layout[r])
            assert (est == exact[r] == 0) or 0.6 * exact[r] <= est <= 1.25 * exact[r], (seed, r, est, exact[r])


def test_head_ring_copies_are_the_all_to_all_and_step_copies() -> None:
    """A Ulysses ring (one block of 8, Llama-7B on one node): under ``zeppelin`` its own time adds the copies
    around the two all-to-alls (zeppelin_a2a_bytes of the 1024 tokens a rank holds and the 8192 rows of its head
    buffer, rows in one range as plan_step lays them out, one block: the kernel's dtype throughout) and its one
    call's lse transpose at the lane's shape; under ``none`` neither."""
    from zeppelin_megatron.planner.cost_heads import head_ring_time
    from zeppelin_megatron.planner.engine_costs import ulysses_call_bytes, zeppelin_a2a_bytes

    cost = _cost()
    plain = head_ring_time(cost, tuple(range(8)), [8192], 8)
    charged = head_ring_time(cost, tuple(range(8)), [8192], 8, "zeppelin")
    a2a = hbm_ms(cost, sum(zeppelin_a2a_bytes(shape_of(cost), 8, 1024, 8192, contiguous=True, blocks=1).values()))
    lane = shape_of(cost, 8)
    diag = hbm_ms(cost, ulysses_call_bytes(lane, 8192))
    assert plain.copy_ms == 0.0
    assert charged.copy_ms == pytest.approx(a2a + diag)
    assert charged.own == pytest.approx(plain.own + a2a + diag)
    assert charged.total - charged.own == pytest.approx(plain.total - plain.own)  # the all-to-alls themselves
