"""`zeppelin replay` on CPU: each rank replays exactly its planned work; report structure; strategies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from zeppelin_megatron.cli import main
from zeppelin_megatron.measure import format_comparison, format_replay, rank_work, replay_plan
from zeppelin_megatron.measure.replay import measure_ideal, plan_works
from zeppelin_megatron.measure.attention import call_pairs
from zeppelin_megatron.planner import CostModel, StepPlan, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.model import ModelShape
from zeppelin_megatron.planner.zigzag import zigzag_ranges
from zeppelin_megatron.runtime.kernels import get_kernel
from zeppelin_megatron.sim.planbuild import build_plan
from zeppelin_megatron.sim.strategies import plan_with

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/models/tiny.yaml"
CPU = torch.device("cpu")
# A long-tailed batch for 2 nodes x 4 GPUs: a few long sequences that get split, many short ones.
LENGTHS = [700, 260, 150, 90, 60, 40, 33, 30, 24, 20, 17, 16, 12, 9, 8, 6, 5, 3, 2, 1]


@pytest.fixture(scope="module")
def setup() -> tuple[Any, CostModel]:
    cluster = load_cluster("2x4", tokens_per_gpu=400)
    return cluster, CostModel(model=load_model(str(TINY)), cluster=cluster)


def _computed(plan: StepPlan, rank: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """Independent of the engine: per sequence the rank computes, ``(divisor of the heads, query token
    ranges)``: its attention-layout tokens with all heads (local sequences, plain rings), or, in a
    head-parallel ring of width ``a``, every token of its block (zigzag positions ``b a .. b a + a - 1``)
    with ``1/a`` of the heads."""
    out = []
    for i, s in enumerate(plan.sequences):
        if rank not in s.ranks:
            continue
        if s.a2a == 1:
            out.append((1, [(a, b) for q, a, b in plan.attention_layout[rank] if q == i]))
        else:
            blk = s.ranks.index(rank) // s.a2a
            out.append((s.a2a, [r for p in range(blk * s.a2a, (blk + 1) * s.a2a)
                                for r in zigzag_ranges(s.length, len(s.ranks), p)]))
    return out


def expected_head_pairs(plan: StepPlan, rank: int, heads: int) -> int:
    """Each query token t the rank computes attends keys 0..t of its sequence (t + 1 pairs), per query head."""
    return sum(heads // d * sum((end * (end + 1) - start * (start + 1)) // 2 for start, end in ranges)
               for d, ranges in _computed(plan, rank))


def check_ring_work(plan: StepPlan, heads: int, kv_heads: int) -> None:
    total = 0
    for r in range(plan.world_size):
        work = rank_work(plan, r, q_heads=heads, kv_heads=kv_heads, device=CPU)
        rings = [ring for ring in plan.rings if r in ring.ranks]
        local = sorted(s.length for s in plan.sequences if s.placement == "local" and s.ranks == (r,))
        ring_index = {ring.ranks: k for k, ring in enumerate(plan.rings)}
        slots = {(x.ring, x.step): x.seqs for x in plan.local_slots if x.rank == r}
        windows = {x.direction: x.seqs for x in plan.remap_slots if x.rank == r}
        leftover = len(local) > sum(len(seqs) for seqs in [*slots.values(), *windows.values()])
        n_chunks = len(slots) + leftover + len(windows)
        # one call per ring step of every ring the rank is in, plus one call per local chunk
        assert len(work.calls) == sum(ring.blocks for ring in rings) + n_chunks  # blocks: head-parallel
        chunks = [c for c in work.calls if c.kind == "local"]
        assert len(chunks) == n_chunks and sorted(c.step for c in chunks) == list(range(n_chunks))
        assert sorted(n for c in chunks for n in c.batch.lens_q) == local  # whole sequences, each once
        # remap windows: the to_attention call first, the to_linear call last
        lens = {d: tuple(plan.sequences[j].length for j in seqs) for d, seqs in windows.items()}
        inner = list(enumerate(work.calls))
        if "to_attention" in windows:
            assert work.calls[0].kind == "local" and work.calls[0].batch.lens_q == lens["to_attention"], r
            inner = inner[1:]
        if "to_linear" in windows:
            assert work.calls[-1].kind == "local" and work.calls[-1].batch.lens_q == lens["to_linear"], r
            inner = inner[:-1]
        # a slot's chunk follows its ring step's call; the leftover chunk comes last
        placed = 0
        for i, c in inner:
            if c.kind != "local":
                continue
            prev = work.calls[i - 1]
            at = (ring_index[rings[prev.queue].ranks], prev.step) if prev.kind != "local" else None
            if at in slots:
                assert c.batch.lens_q == tuple(plan.sequences[j].length for j in slots[at]), (r, i)
                placed += 1
            else:
                assert leftover and i == inner[-1][0], (r, i, prev)
        assert placed == len(slots)
        # diagonal steps + the local calls cover the tokens the rank computes exactly once (its attention-layout
        # tokens; its block's in a head-parallel ring)
        own = [c for c in work.calls if c.kind in ("ring_diag", "local")]
        assert sum(c.q_tokens for c in own) == sum(b - a for _, ranges in _computed(plan, r) for a, b in ranges)
        assert plan.tokens(r, "attention") == work.attention_tokens
        assert work.linear_tokens == plan.tokens(r, "linear")
        # all steps together compute exactly the causal (query, key) pairs of the rank's tokens
        head_pairs = sum(call_pairs(c.batch) * c.q_heads for c in work.calls)
        assert head_pairs == expected_head_pairs(plan, r, heads)
        total += head_pairs
    assert total == heads * sum(s.length * (s.length + 1) // 2 for s in plan.sequences)


def test_zeppelin_plan_work_covers_exactly_the_planned_tokens(setup: tuple[Any, CostModel]) -> None:
    cluster, cost = setup
    plan = plan_step(LENGTHS, cost)
    assert {s.placement for s in plan.sequences} >= {"local", "intra_node"}
    check_ring_work(plan, 2, 1)


def test_te_cp_plan_work_covers_exactly_the_planned_tokens(setup: tuple[Any, CostModel]) -> None:
    cluster, cost = setup
    sp = plan_with("te-cp", LENGTHS, cluster, cost, cp_size=8)
    assert sp.attention_comm == "ring" and any(len(s.ranks) == 8 for s in sp.plan.sequences)
    check_ring_work(sp.plan, 2, 1)


def test_allgather_and_ulysses_calls_cover_the_causal_work(setup: tuple[Any, CostModel]) -> None:
    cluster, cost = setup
    lengths = [96, 40, 33, 7, 3]
    groups = [(0, 1, 4, 5), (2, 3), (2, 3), (6,), (7,)]
    plan = build_plan(lengths, groups, cluster, cost)
    full = sum(s * (s + 1) // 2 for s in lengths)
    for comm, heads, kv in (("allgather", 2, 1), ("ulysses", 8, 4)):
        total = 0
        for r in range(plan.world_size):
            work = rank_work(plan, r, q_heads=heads, kv_heads=kv, device=CPU, attention_comm=comm)
            pairs = sum(call_pairs(c.batch) * c.q_heads for c in work.calls)
            if comm == "allgather":  # each rank: its own queries against all earlier keys
                assert pairs == expected_head_pairs(plan, r, heads)
            total += pairs
        assert total == heads * full, comm
    # ulysses on rank 2 (group of 2 holding sequences 40 and 33): both whole, half the heads
    (call,) = rank_work(plan, 2, q_heads=8, kv_heads=4, device=CPU, attention_comm="ulysses").calls
    assert call.batch.lens_q == (40, 33) and (call.q_heads, call.kv_heads) == (4, 2)
    # fewer K/V heads than ranks: one replicated K/V head per rank
    (call,) = rank_work(plan, 2, q_heads=2, kv_heads=1, device=CPU, attention_comm="ulysses").calls
    assert (call.q_heads, call.kv_heads) == (1, 1)
    with pytest.raises(ValueError, match=r"needs q_heads \(2\) divisible by 4"):
        rank_work(plan, 0, q_heads=2, kv_heads=1, device=CPU, attention_comm="ulysses")
    with pytest.raises(ValueError, match=r"needs kv_heads \(3\) to divide or be a multiple of 4"):
        rank_work(plan, 0, q_heads=12, kv_heads=3, device=CPU, attention_comm="ulysses")
    with pytest.raises(ValueError, match="attention_comm='bogus' is not supported"):
        rank_work(plan, 0, q_heads=2, kv_heads=1, device=CPU, attention_comm="bogus")


class Recorder:
    """Reference kernel that records every call (direction, batch, tensor shapes)."""

    name = "recorder"

    def __init__(self) -> None:
        self.inner = get_kernel("reference", CPU, torch.float32)
        self.log: list[tuple[str, Any, tuple[int, ...], tuple[int, ...]]] = []

    def forward(self, q, k, v, batch, scale):  # type: ignore[no-untyped-def]
        self.log.append(("fwd", batch, tuple(q.shape), tuple(k.shape)))
        return self.inner.forward(q, k, v, batch, scale)

    def backward(self, dout, q, k, v, out, lse, batch, scale):  # type: ignore[no-untyped-def]
        assert out.shape == q.shape and lse.shape == q.shape[:2]
        self.log.append(("bwd", batch, tuple(q.shape), tuple(k.shape)))
        return self.inner.backward(dout, q, k, v, out, lse, batch, scale)


def test_replay_runs_each_ranks_calls_forward_then_backward(setup: tuple[Any, CostModel]) -> None:
    cluster, cost = setup
    model = cost.model
    plan = plan_step(LENGTHS, cost)
    rec = Recorder()
    res = replay_plan(plan, model=model, kernel=rec, dtype=torch.float32, device=CPU, warmup=0, repeats=1)
    assert len(res.ranks) == 8 and res.attention_comm == "ring" and res.layers == model.layers
    pos = 0
    for row in res.ranks:
        work = rank_work(plan, row.rank, q_heads=2, kv_heads=1, device=CPU)
        n = len(work.calls)
        fwd, bwd = rec.log[pos:pos + n], rec.log[pos + n:pos + 2 * n]
        pos += 2 * n
        assert [e[0] for e in fwd] == ["fwd"] * n and [e[0] for e in bwd] == ["bwd"] * n
        for call, f, b in zip(work.calls, fwd, bwd):
            assert f[1].lens_q == b[1].lens_q == call.batch.lens_q
            assert f[1].lens_k == b[1].lens_k == call.batch.lens_k and f[1].causal == call.batch.causal
            assert f[2] == (call.q_tokens, call.q_heads, 16) and f[3] == (call.k_tokens, call.kv_heads, 16)
        assert row.calls == n and row.attention_tokens == plan.tokens(row.rank, "attention")
        assert row.linear_tokens == plan.tokens(row.rank, "linear")
        assert row.head_pairs == expected_head_pairs(plan, row.rank, 2)
        assert row.attention_ms >= 0 and row.linear_ms > 0
        assert row.predicted_attention_ms == pytest.approx(plan.predicted.attention_ms[row.rank] / model.layers)
        assert row.predicted_linear_ms == pytest.approx(plan.predicted.linear_ms[row.rank] / model.layers)
        if row.predicted_attention_ms > 0:
            assert row.error("attention") == pytest.approx(row.attention_ms / row.predicted_attention_ms - 1)
        else:  # a rank without attention work: nothing to compare against
            assert row.calls == 0 and row.error("attention") is None
    assert pos == len(rec.log)
    s = res.summary()
    totals = [r.total_ms for r in res.ranks]
    assert s["total"]["max_ms"] == max(totals) and s["total"]["perfect_balance_ms"] == pytest.approx(sum(totals) / 8)
    assert s["total"]["slowest_rank"] == totals.index(max(totals))
    assert s["attention"]["max_over_mean"] >= 1.0
    text = format_replay(res, 4)
    assert "communication (ring hops, routing, remap all-to-alls) is not replayed" in text
    assert "predicted: cost model" in text and len([ln for ln in text.splitlines() if ln[:4].strip().isdigit()]) == 8
    assert "comparison" in format_comparison([res, res])


def test_replay_cli_strategies_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(map(str, [300, 120, 40, 30, 20, 12, 9, 5, 3, 1])) + "\n")
    out = tmp_path / "replay.json"
    rc = main(["replay", "--lengths", str(lengths), "--cluster", "2x4", "--tokens-per-gpu", "200",
               "--model", str(TINY), "--strategies", "zeppelin,te-cp", "--device", "cpu", "--repeats", "1",
               "--warmup", "0", "--ideal", "--json", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "== zeppelin" in text and "== te-cp" in text and "== comparison" in text
    assert "whole/ranks (measured, --ideal)" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "zeppelin-replay/1" and doc["cluster"] == "2x4" and doc["model"]["name"] == "tiny"
    assert [s["strategy"] for s in doc["strategies"]] == ["zeppelin", "te-cp"]
    assert doc["ideal"]["ranks"] == 8 and doc["ideal"]["calls"] == 1 and doc["ideal"]["attention_ms"] > 0
    for strat in doc["strategies"]:
        assert "not replayed" in strat["communication"] and len(strat["ranks"]) == 8
        assert sum(r["attention_tokens"] for r in strat["ranks"]) == 540
        assert set(strat["summary"]) == {"attention", "linear", "total"}
        for r in strat["ranks"]:
            assert r["predicted_attention_ms"] is not None
            # a rank the plan leaves idle (no-remap plans may) has no relative error; every other rank has one
            idle = r["attention_tokens"] == 0 and r["linear_tokens"] == 0
            assert (r["error_total"] is None) == idle, r


def test_replay_cli_plan_json_without_prediction(tmp_path: Path, setup: tuple[Any, CostModel],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cluster, cost = setup
    plan = plan_step([200, 50, 20, 9, 4], cost)
    doc = plan.to_dict()
    del doc["predicted"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "r.json"
    assert main(["replay", "--plan", str(path), "--model", str(TINY), "--device", "cpu", "--ranks", "0-2,6",
                 "--repeats", "1", "--warmup", "0", "--json", str(out), "--quiet"]) == 0
    res = json.loads(out.read_text())["strategies"][0]
    assert [r["rank"] for r in res["ranks"]] == [0, 1, 2, 6]
    assert "predictions recomputed" in res["note"]
    assert all(r["predicted_attention_ms"] is not None for r in res["ranks"])


@pytest.mark.parametrize("args, message", [
    (["--strategies", "nope"], "unknown strategy 'nope'"),
    (["--ranks", "0-9"], "--ranks: '0-9' is outside [0, 8)"),
    (["--backend", "flash_attn"], "needs a CUDA device"),
    (["--tensor-parallel", "2"], "kv_heads = 1 is not divisible by tensor_parallel = 2"),
])
def test_replay_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           args: list[str], message: str) -> None:
    lengths = tmp_path / "l.txt"
    lengths.write_text("40\n8\n")
    rc = main(["replay", "--lengths", str(lengths), "--cluster", "2x4", "--model", str(TINY), "--device", "cpu",
               "--repeats", "1", "--warmup", "0", "--quiet", *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_replay_needs_cluster_with_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths = tmp_path / "l.txt"
    lengths.write_text("40\n")
    assert main(["replay", "--lengths", str(lengths), "--model", str(TINY), "--device", "cpu"]) == 2
    assert "--lengths needs --cluster" in capsys.readouterr().err


def test_measure_ideal_groups_whole_sequences(setup: tuple[Any, CostModel]) -> None:
    _, cost = setup
    kw = dict(model=cost.model, kernel=get_kernel("reference", CPU, torch.float32), dtype=torch.float32, device=CPU,
              warmup=0, repeats=1)
    ideal = measure_ideal([8, 5, 4, 1], 4, tokens_per_call=10, **kw)
    assert ideal.calls == 2 and ideal.ranks == 4 and ideal.total_ms == ideal.attention_ms + ideal.linear_ms
    assert measure_ideal([30, 8], 2, tokens_per_call=10, **kw).calls == 2  # a longer sequence: a call of its own
    with pytest.raises(ValueError, match="at least one sequence"):
        measure_ideal([], 2, **kw)


def test_plan_works_fails_before_timing(setup: tuple[Any, CostModel]) -> None:
    cluster, cost = setup
    plan = build_plan([40, 33, 7], [(2, 3, 4, 5), (2, 3), (6,)], cluster, cost)
    with pytest.raises(ValueError, match="divisible by 4"):
        plan_works(plan, model=cost.model, device=CPU, attention_comm="ulysses")  # tiny: 2 q heads, 1 kv head
    with pytest.raises(ValueError, match="rank 8 is outside the plan's"):
        plan_works(plan, model=cost.model, device=CPU, ranks=[8])
    works = plan_works(plan, model=cost.model, device=CPU, ranks=[2, 6])
    assert [w.rank for w in works] == [2, 6] and [len(w.calls) for w in works] == [4 + 2, 1]


def test_routed_inter_node_rings_in_any_rank_order(setup: tuple[Any, CostModel]) -> None:
    cluster, cost = setup
    # Two inter-node rings sharing ranks (rank 5 in both, ring order not sorted), an intra-node ring, locals.
    lengths = [333, 200, 120, 64, 50, 9, 4, 1]
    groups = [(5, 0, 7, 2), (3, 5, 6, 1), (4, 6), (4, 6), (0, 1), (7,), (2,), (3,)]
    plan = build_plan(lengths, groups, cluster, cost, routing=True)
    assert {s.placement for s in plan.sequences} == {"local", "intra_node", "inter_node"}
    check_ring_work(plan, 2, 1)
    work5 = rank_work(plan, 5, q_heads=2, kv_heads=1, device=CPU)
    assert [c.queue for c in work5.calls] == [0] * 4 + [1] * 4  # both rings of 4 steps, no local sequence
    # plan.rings order (by ranks): (3, 5, 6, 1) first, where rank 5 is position 1: sources 1, 0, 3, 2;
    # then (5, 0, 7, 2), position 0: sources 0, 3, 2, 1 (all later positions -> late-chunk calls)
    assert [c.kind for c in work5.calls] == ["ring_diag", "ring_early", "ring_late", "ring_late",
                                             "ring_diag", "ring_late", "ring_late", "ring_late"]


def _head_plan() -> StepPlan:
    """2 nodes x 4 GPUs: sequence 0 (64 tokens) Ulysses over ranks (0, 1, 2, 3) (a2a 4), sequence 1 (96)
    hybrid over (4, 5, 0, 1) (a2a 2: block 0 = ranks 4, 5 on node 1, block 1 = ranks 0, 1), sequence 2 (40)
    a plain ring over (6, 7), locals 10 on rank 2 and 7 on rank 6; linear layout = attention layout."""
    from zeppelin_megatron.planner.plan import SequencePlan

    items = [(64, (0, 1, 2, 3), 4, "intra_node"), (96, (4, 5, 0, 1), 2, "inter_node"), (40, (6, 7), 1, "intra_node")]
    att: list[list[tuple[int, int, int]]] = [[] for _ in range(8)]
    seqs = []
    for i, (n, ranks, a2a, place) in enumerate(items):
        seqs.append(SequencePlan(n, place, ranks, a2a))  # type: ignore[arg-type]
        for p, r in enumerate(ranks):
            att[r] += [(i, a, b) for a, b in zigzag_ranges(n, len(ranks), p)]
    for n, r in ((10, 2), (7, 6)):
        att[r].append((len(seqs), 0, n))
        seqs.append(SequencePlan(n, "local", (r,)))
    lay = tuple(tuple(x) for x in att)
    return StepPlan(nodes=2, gpus_per_node=4, sequences=tuple(seqs), attention_layout=lay, linear_layout=lay)


def test_head_parallel_rings_replay_each_lanes_calls_with_its_heads() -> None:
    """GQA 8 query / 2 K/V heads per rank: a Ulysses lane (width 4) calls with 2 query heads and one
    replicated K/V head, a hybrid lane (width 2) with 4 and 1, the plain ring with all 8 and 2. Every lane
    computes each causal pair of its ring once over its heads, so all ranks together compute 8 x the
    causal pairs of every sequence."""
    plan = _head_plan()
    works = {r: rank_work(plan, r, q_heads=8, kv_heads=2, device=CPU) for r in range(8)}
    calls = {r: [(c.kind, c.batch.lens_q, c.batch.lens_k, c.q_heads, c.kv_heads) for c in w.calls]
             for r, w in works.items()}
    # rank 1: hybrid ring first (inter-node rings first in queue order): block 1, lane 1, tokens [24, 72);
    # its step 1 holds block 0's K/V ([0, 24) + [72, 96)) -> early: all 48 rows against 24 early keys;
    # then the Ulysses ring: one causal call over the whole 64-token sequence
    assert calls[1] == [("ring_diag", (48,), (48,), 4, 1), ("ring_early", (48,), (24,), 4, 1),
                        ("ring_diag", (64,), (64,), 2, 1)]
    # rank 4: block 0, lane 0 of the hybrid: diagonal over [0, 24) + [72, 96), then its 24 late rows
    # against block 1's 48 keys
    assert calls[4] == [("ring_diag", (48,), (48,), 4, 1), ("ring_late", (24,), (48,), 4, 1)]
    assert calls[2] == [("ring_diag", (64,), (64,), 2, 1), ("local", (10,), (10,), 8, 2)]
    assert calls[6] == [("ring_diag", (20,), (20,), 8, 2), ("ring_late", (10,), (20,), 8, 2),
                        ("local", (7,), (7,), 8, 2)]
    total = sum(call_pairs(c.batch) * c.q_heads for w in works.values() for c in w.calls)
    assert total == 8 * sum(s.length * (s.length + 1) // 2 for s in plan.sequences)
    check_ring_work(plan, 8, 2)  # per rank: its block's pairs with its lane's heads, derived from the zigzag
    # replay runs those calls with those shapes (the kernel sees [T, heads, D] views of each call's heads)
    model = ModelShape(layers=2, hidden=128, q_heads=8, kv_heads=2, ffn=256, head_dim=16, name="gqa-tiny")
    rec = Recorder()
    res = replay_plan(plan, model=model, kernel=rec, dtype=torch.float32, device=CPU, warmup=0, repeats=1,
                      ranks=[1, 4])
    fwd = [e for e in rec.log if e[0] == "fwd"]
    assert [(f[2], f[3]) for f in fwd] == [((48, 4, 16), (48, 1, 16)), ((48, 4, 16), (24, 1, 16)),
                                           ((64, 2, 16), (64, 1, 16)), ((48, 4, 16), (48, 1, 16)),
                                           ((24, 4, 16), (48, 1, 16))]
    assert [r.head_pairs for r in res.ranks] == [
        sum(call_pairs(c.batch) * c.q_heads for c in works[r].calls) for r in (1, 4)]
    assert [r.a2a for r in plan.rings] == [2, 1, 4]  # queue order: inter-node first, then by ranks
    with pytest.raises(ValueError, match=r"ring 2 \(ranks \[0, 1, 2, 3\]\) is head-parallel of width 4, but 6 query "
                                         r"and 2 K/V heads cannot split over it: 4 lanes do not divide 6"):
        rank_work(plan, 0, q_heads=6, kv_heads=2, device=CPU)


def _window_plan() -> StepPlan:
    """1 x 2 GPUs: sequence 0 (16 tokens) a ring over (0, 1), sequences 1 (5), 2 (3) and 3 (4) local on rank 0,
    4 (6) local on rank 1. Linear layout: rank 0 keeps 1 and 2 whole and gives 3 to rank 1, so the remap moves
    rows; sequence 1 runs in rank 0's remap in window, 2 in its remap out window, 4 in rank 1's remap in."""
    from zeppelin_megatron.planner.plan import RemapSlot, SequencePlan

    seqs = (SequencePlan(16, "intra_node", (0, 1)), SequencePlan(5, "local", (0,)), SequencePlan(3, "local", (0,)),
            SequencePlan(4, "local", (0,)), SequencePlan(6, "local", (1,)))
    att = (((0, 0, 4), (0, 12, 16), (3, 0, 4), (1, 0, 5), (2, 0, 3)), ((0, 4, 12), (4, 0, 6)))
    lin = (((1, 0, 5), (0, 0, 4), (0, 12, 16), (2, 0, 3)), ((0, 4, 12), (3, 0, 4), (4, 0, 6)))
    return StepPlan(nodes=1, gpus_per_node=2, sequences=seqs, attention_layout=att, linear_layout=lin,
                    remap_slots=(RemapSlot(0, "to_attention", (1,)), RemapSlot(0, "to_linear", (2,)),
                                 RemapSlot(1, "to_attention", (4,))))


def test_remap_window_calls_are_replayed_where_the_engine_runs_them() -> None:
    """Rank 0: its remap in window (sequence 1) before the ring, the ring's two steps, the leftover local
    sequence 3 after the rings, its remap out window (sequence 2) last; rank 1: its window (sequence 4), then
    the ring. Every window call is a causal local call over whole sequences; replay runs each forward
    then backward."""
    plan = _window_plan()
    works = {r: rank_work(plan, r, q_heads=2, kv_heads=1, device=CPU) for r in range(2)}
    calls = {r: [(c.kind, c.batch.lens_q, c.batch.lens_k, c.batch.causal) for c in w.calls] for r, w in works.items()}
    assert calls[0] == [("local", (5,), (5,), True), ("ring_diag", (8,), (8,), True),
                        ("ring_late", (4,), (8,), False), ("local", (4,), (4,), True), ("local", (3,), (3,), True)]
    assert calls[1] == [("local", (6,), (6,), True), ("ring_diag", (8,), (8,), True),
                        ("ring_early", (8,), (4,), False)]
    check_ring_work(plan, 2, 1)
    model = ModelShape(layers=2, hidden=32, q_heads=2, kv_heads=1, ffn=64, head_dim=16, name="window-tiny")
    rec = Recorder()
    res = replay_plan(plan, model=model, kernel=rec, dtype=torch.float32, device=CPU, warmup=0, repeats=1)
    for direction in ("fwd", "bwd"):
        assert [(e[1].lens_q, e[2][0]) for e in rec.log if e[0] == direction] == [
            ((5,), 5), ((8,), 8), ((4,), 4), ((4,), 4), ((3,), 3), ((6,), 6), ((8,), 8), ((8,), 8)]
    assert [r.calls for r in res.ranks] == [5, 3]
    assert [r.head_pairs for r in res.ranks] == [expected_head_pairs(plan, r, 2) for r in range(2)]
