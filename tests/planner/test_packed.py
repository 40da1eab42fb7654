"""Packed candidates (planner/packed.py): WLB-LLM's packing, its floors, and plan_step's choice."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import pytest

from zeppelin_megatron.planner import (
    CostModel, PlanError, PlannerOptions, StepPlan, load_cluster, load_model, plan_step,
)
from zeppelin_megatron.planner import api, packed
from zeppelin_megatron.planner.grouped import pack_sizes
from zeppelin_megatron.planner.cost_heads import head_ring_time, head_widths
from zeppelin_megatron.planner.packed_search import best_packed
from zeppelin_megatron.planner.packed_wide import wide_spans
from zeppelin_megatron.planner.packed import (
    head_parallel_threshold, packed_assignments, packed_floor, packed_groups, quick_floor, share_threshold,
    sharded_ms, split_pays,
)
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.planner.workloads import long_tailed_batch
from zeppelin_megatron.planner.zigzag import zigzag_counts


def _cost(spec: str, model: str | None = None, **kw: int) -> CostModel:
    return CostModel(model=load_model(model), cluster=load_cluster(spec, **kw))


def _reference_groups(lengths: list[int], cost: CostModel, cp: int, head_parallel: bool = False,
                      shard_from: int | None = None, first: int = 0,
                      lead: Sequence[int] = ()) -> list[tuple[int, ...]]:
    """The packing written as plain scans (every group, every rank, each time): what the heaps must match.
    ``lead``: a filled leading group over ranks ``0 .. first-1`` (group ``n``, its work per rank scaled by
    ``cp / first``, whole documents only)."""
    world, cap = cost.cluster.world_size, cost.cluster.tokens_per_gpu
    n = (world - first) // cp
    shard = [(s >= shard_from or s > cap) if shard_from is not None else (split_pays(cost, s, cp) or s > cap)
             for s in lengths]
    shard = [sh and i not in lead for i, sh in enumerate(shard)]
    share = max(1, sum(lengths) // (world - (0 if lead else first)))
    lin = cost.linear_ms(share) / share
    gpn = cost.cluster.gpus_per_node

    def ring(s: int, g: int) -> float:
        return sharded_ms(cost, s, g) if head_parallel else cost.ring_ms(s, g, inter_node=g > gpn)

    work = [(cp * ring(s, cp) if sh else cost.local_ms(s)) + s * lin for s, sh in zip(lengths, shard)]
    for i in lead:
        work[i] = first * ring(lengths[i], first) + lengths[i] * lin
    order = [i for i in sorted(range(len(lengths)), key=lambda i: (-work[i], -lengths[i], i)) if i not in lead]
    scale = cp / first if lead else 1.0
    g_work = [0.0] * n + ([scale * sum(work[i] for i in lead)] if lead else [])
    g_tok = [0] * n + ([sum(lengths[i] for i in lead)] if lead else [])
    where = [-1] * len(lengths)
    for i in order:
        room = [b for b in range(n) if g_tok[b] + lengths[i] <= cp * cap]
        if lead and not shard[i] and g_tok[n] + lengths[i] <= first * cap:
            room.append(n)
        b = min(room, key=lambda b: (g_work[b], b))
        where[i], g_tok[b] = b, g_tok[b] + lengths[i]
        g_work[b] += work[i] * (scale if b == n else 1.0)
    load, tok = [0.0] * world, [0] * world
    out: list[tuple[int, ...]] = [()] * len(lengths)
    for i, s in enumerate(lengths):
        if i in lead:
            out[i] = tuple(range(first))
            for r, t in zip(out[i], zigzag_counts(s, first)):
                load[r] += work[i] / first
                tok[r] += t
        elif shard[i]:
            out[i] = tuple(range(first + where[i] * cp, first + (where[i] + 1) * cp))
            for r in out[i]:
                load[r] += work[i] / cp
                tok[r] += -(-s // cp)
    for i in order:
        if not out[i]:
            ranks = range(first) if where[i] == n else range(first + where[i] * cp, first + (where[i] + 1) * cp)
            r = min((r for r in ranks if tok[r] + lengths[i] <= cap), key=lambda r: (load[r], r))
            out[i], load[r], tok[r] = (r,), load[r] + work[i], tok[r] + lengths[i]
    return out


def test_packing_after_a_leading_group_uses_only_the_ranks_after_it() -> None:
    """packed_groups(..., first=k): the same packing over ranks k .. P-1 (heaps against plain scans); bad values
    named."""
    cost = _cost("4x8")
    checked = 0
    for seed in range(3):
        lengths = long_tailed_batch(1 << 18, seed)[1:]
        for first in (8, 16):
            for cp in (2, 4, 8):
                t = head_parallel_threshold(lengths, cost, cp)
                for hp, sf in ((False, None), (True, t)):
                    try:
                        got = packed_groups(lengths, cost, cp, head_parallel=hp, shard_from=sf, first=first)
                    except PlanError:
                        continue
                    assert got == _reference_groups(lengths, cost, cp, hp, sf, first), (seed, first, cp)
                    assert min(r for g in got for r in g) >= first
                    checked += 1
    assert checked > 20
    with pytest.raises(PlanError, match="cp_size = 16 must be a positive divisor of the 24 ranks from 8"):
        packed_groups([10], cost, 16, first=8)
    with pytest.raises(PlanError, match=r"first = 32 must be a rank in \[0, 32\)"):
        packed_groups([10], cost, 2, first=32)


def test_lead_splits_take_the_work_share_of_their_ranks() -> None:
    """lead_splits: per k (whole nodes, up to half the world) the n longest sequences (2 <= n <= LEAD_MAX) whose
    share of the work is closest to k / P, each of at least 2 k tokens and within capacity; lead_floor bounds every
    led packing's floor, which bounds its finished prediction. On 6 x 8 GPUs: k = 8, 16 and 24 (not a power of
    two) are offered."""
    from zeppelin_megatron.planner.packed_search import LEAD_MAX, _led, lead_floor, lead_splits
    from zeppelin_megatron.planner.partition_context import Assignment
    from zeppelin_megatron.sim.lengths import sample_steps
    cost = _cost("6x8")
    options = PlannerOptions()
    seen, sizes = 0, set()
    for lengths in [b for d in ("github-64k", "prolong-64k", "arxiv-128k") for b in sample_steps(d, 2, 3 << 17, 0)]:
        world = cost.cluster.world_size
        share = max(1, sum(lengths) // world)
        lin = cost.linear_ms(share) / share
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
        work = [cost.local_ms(lengths[i]) + lengths[i] * lin for i in order]
        cum = [sum(work[:n]) / sum(work) for n in range(1, len(work) + 1)]
        offered = lead_splits(lengths, cost)
        for k in set(range(8, world // 2 + 1, 8)) - {k for k, _ in offered}:  # left out: too few or too many
            n = min(range(1, len(order)), key=lambda m: (abs(cum[m - 1] - k / world), m))
            while n and lengths[order[n - 1]] < 2 * k:
                n -= 1
            assert n < 2 or n > LEAD_MAX or max(map(sum, zip(*(zigzag_counts(lengths[i], k) for i in order[:n])))) > \
                cost.cluster.tokens_per_gpu
        for k, top in offered:
            assert k % 8 == 0 and k <= world // 2 and 2 <= len(top) <= LEAD_MAX
            sizes.add(k)
            assert top == order[:len(top)] and all(lengths[i] >= 2 * k for i in top)
            n = min(range(1, len(order)), key=lambda m: (abs(cum[m - 1] - k / world), m))
            assert len(top) == n or lengths[order[len(top)]] < 2 * k
            bound = lead_floor([lengths[i] for i in top], k, cost, options)
            lead = Assignment("intra_node" if k <= 8 else "inter_node", tuple(range(k)))
            narrow, wide = _led(lengths, top, lead, cost, options, float("inf"), bound)
            assert len(narrow) <= 1 and wide == []  # wide-span rests only with packed_rerank
            rerank = _led(lengths, top, lead, cost, replace(options, packed_rerank=True), float("inf"), bound)
            assert rerank[0] == narrow and len(rerank[1]) <= 1
            for floor, _cp, assignments in rerank[0] + rerank[1]:
                assert all(a == lead for i, a in enumerate(assignments) if i in top)
                assert bound <= floor + 1e-6
                plan = api._finish(lengths, assignments, cost, replace(options, remap=False))
                assert floor <= predict(plan, cost, charges="zeppelin").step_ms + 1e-6
                seen += 1
    assert seen >= 3 and 24 in sizes


def test_zigzag_counts_are_the_tokens_of_every_position() -> None:
    from zeppelin_megatron.planner.zigzag import zigzag_counts, zigzag_tokens
    rng = random.Random(3)
    for _ in range(500):
        g = rng.randint(1, 64)
        s = rng.randint(2 * g, 50_000)
        assert zigzag_counts(s, g) == tuple(zigzag_tokens(s, g, p) for p in range(g))
    assert zigzag_counts(41, 2) == (21, 20)


def test_worked_example() -> None:
    cost = _cost("1x4")
    lengths = [9000, 3000, 3000, 1000]
    assert [split_pays(cost, s, 2) for s in lengths] == [True, False, False, False]
    assert packed_groups(lengths, cost, 2) == [(0, 1), (2,), (3,), (2,)]
    assert packed_groups(lengths, cost, 1) == [(0,), (1,), (2,), (3,)]
    assert pack_sizes(lengths, cost.cluster) == [1, 2, 4]
    a = packed_assignments(lengths, cost, 2)
    assert a is not None and [x.placement for x in a] == ["intra_node", "local", "local", "local"]


@pytest.mark.parametrize("head_parallel", [False, True])
@pytest.mark.parametrize("spec,tokens", [("2x8", 1 << 19), ("4x8", 1 << 20), ("2x3", 1 << 17)])
def test_heaps_match_plain_scans_and_place_every_token(spec: str, tokens: int, head_parallel: bool) -> None:
    for seed in range(4):
        cost = _cost(spec)
        lengths = long_tailed_batch(tokens, seed)
        cap = cost.cluster.tokens_per_gpu
        for cp in pack_sizes(lengths, cost.cluster):
            shard_from = head_parallel_threshold(lengths, cost, cp) if head_parallel else None
            try:
                got = packed_groups(lengths, cost, cp, head_parallel=head_parallel, shard_from=shard_from)
            except PlanError:
                continue
            assert got == _reference_groups(lengths, cost, cp, head_parallel, shard_from), (spec, seed, cp)
            held = [0] * cost.cluster.world_size
            for s, g in zip(lengths, got):
                assert len(g) in (1, cp) and list(g) == list(range(g[0], g[0] + len(g)))
                assert len(g) == 1 or g[0] % cp == 0
                for r in g:
                    held[r] += -(-s // len(g))
            assert max(held) <= cap


def test_sharded_work_is_the_cheaper_of_the_plain_and_the_head_parallel_ring() -> None:
    cost = _cost("2x8")
    gpn = cost.cluster.gpus_per_node
    cheaper = 0
    for cp in (2, 4, 8, 16):
        for s in (2 * cp, 3000, 27_000, 100_000):
            plain = cost.ring_ms(s, cp, inter_node=cp > gpn)
            heads = [head_ring_time(cost, tuple(range(b, b + cp)), [s], a).total
                     for b in range(0, cost.cluster.world_size, cp) for a in head_widths(cost, tuple(range(b, b + cp)))]
            assert sharded_ms(cost, s, cp) == pytest.approx(min([plain] + heads), rel=1e-12), (cp, s)
            cheaper += sharded_ms(cost, s, cp) < plain - 1e-9
    assert cheaper, "a head-parallel ring beats the plain one for some of these documents"
    # WLB-LLM's packing (the default) weighs by the plain ring: where the two models weigh a sharded document
    # differently, the packings can differ, and plan_step's packed candidates include both
    lengths = long_tailed_batch(1 << 19, 0)
    diff = sum(packed_groups(lengths, cost, cp) != packed_groups(lengths, cost, cp, head_parallel=True)
               for cp in (2, 4, 8, 16))
    assert diff, "on this batch the head-parallel work model packs differently at some cp"


@pytest.mark.parametrize("model", [None, "configs/models/llama_3b.yaml"])
def test_head_parallel_threshold_is_where_sharding_starts_to_pay(model: str | None) -> None:
    """On a grid of lengths the test (a head-parallel ring beats one GPU, whose time exceeds a call's overhead)
    flips once, from false to true, for every cp; the bisection finds the first length of the batch that passes,
    as a scan does."""
    cost = _cost("16x8", None if model is None else str(Path(__file__).parents[2] / model))
    o = cost.call_overhead_ms
    for cp in (2, 4, 8, 16, 32, 64, 128):
        grid = list(range(2 * cp, 70_000, 97))
        pays = [cost.local_ms(s) > o and sharded_ms(cost, s, cp) < cost.local_ms(s) for s in grid]
        flips = sum(a != b for a, b in zip(pays, pays[1:]))
        assert flips == 1 and pays[-1] and not pays[0], (cp, flips)
        # a plain ring that pays pays head-parallel too: the threshold packing loses no split_pays shard
        assert all(p for s, p in zip(grid, pays) if split_pays(cost, s, cp)), cp
        lengths = long_tailed_batch(1 << 20, cp)
        scan = next((s for s in sorted(set(lengths)) if s >= 2 * cp and cost.local_ms(s) > o
                     and sharded_ms(cost, s, cp) < cost.local_ms(s)), None)
        assert head_parallel_threshold(lengths, cost, cp) == scan, cp
    assert head_parallel_threshold([100, 200], cost, 1) is None
    assert head_parallel_threshold([100, 200], cost, 8) is None  # too short to pay


def _exhaustive_packed(lengths: list[int], cost: CostModel, plan: StepPlan) -> StepPlan:
    """best_packed without its shortcuts (no skipped cp, the threshold and share packings at every cp, no
    floors): every uniform packing, and per leading group of lead_splits its rest's threshold packing with the
    lowest floor over every cp (the one best_packed keeps), finished; the lowest charged prediction kept (ties:
    the plan, then the lower floor, the smaller cp)."""
    from zeppelin_megatron.planner.packed_search import fill_splits, lead_splits
    from zeppelin_megatron.planner.partition_context import Assignment
    options = PlannerOptions()
    finish = lambda a: api._candidate(lengths, a, cost, replace(options, remap=False)).evolve(origin="packed")  # noqa: E731
    cands, seen = [], set()
    must = share_threshold(lengths, cost, cost.cluster.world_size)
    for cp in pack_sizes(lengths, cost.cluster):
        t = head_parallel_threshold(lengths, cost, cp)
        shares = [(True, must, ())] if t is not None and must is not None and must > t else []
        world = cost.cluster.world_size
        spans = wide_spans(lengths, cost, cp, world, t) if t is not None and 4 * cp <= world else ()
        wides = [(True, t, spans)] if spans else []
        for hp, shard_from, wide in [(False, None, ()), (True, None, ()), (True, t, ())] + shares + wides:
            a = packed_assignments(lengths, cost, cp, head_parallel=hp, shard_from=shard_from, absorb=hp, wide=wide)
            if a is None or tuple(a) in seen:
                continue
            seen.add(tuple(a))
            cands.append((packed_floor(lengths, a, cost, options), cp, a))
    world, gpn = cost.cluster.world_size, cost.cluster.gpus_per_node

    def rests(ls: list[int], k: int, lead: list[int]) -> list[tuple[int, list[Assignment]]]:
        # per cp dividing the ranks after the lead: the threshold packing (cp >= 2), every sequence whole (cp = 1)
        out = []
        for cp in (c for c in (1, 2, 4, 8, 16, 32, 64) if c <= world - k and (world - k) % c == 0):
            t = head_parallel_threshold([s for i, s in enumerate(ls) if i not in lead], cost, cp)
            if cp > 1 and t is None:
                continue
            sub = packed_assignments(ls, cost, cp, head_parallel=True, shard_from=t, first=k, lead=lead, absorb=True)
            if sub is not None:
                out.append((cp, sub))
        return out

    def keep_lowest(found: list[tuple[float, int, list[Assignment]]]) -> None:
        if found:
            chosen = min(found, key=lambda x: (x[0], x[1]))
            if tuple(chosen[2]) not in seen:
                seen.add(tuple(chosen[2]))
                cands.append(chosen)

    for k, top in lead_splits(lengths, cost):
        rest = [i for i in range(len(lengths)) if i not in top]
        lead = Assignment("intra_node" if k <= gpn else "inter_node", tuple(range(k)))
        led = []
        for cp, sub in rests([lengths[i] for i in rest], k, []):
            full = [lead] * len(lengths)
            for i, x in zip(rest, sub):
                full[i] = x
            led.append((packed_floor(lengths, full, cost, options), cp, full))
        keep_lowest(led)
    for k, top in fill_splits(lengths, cost):
        keep_lowest([(packed_floor(lengths, a, cost, options), cp, a) for cp, a in rests(lengths, k, top)])
    best, best_ms = plan, predict(plan, cost, charges="zeppelin").step_ms
    for _floor, _cp, a in sorted(cands, key=lambda x: (x[0], x[1])):
        cand = finish(a)
        ms = predict(cand, cost, charges="zeppelin").step_ms
        if ms < best_ms - 1e-6:
            best, best_ms = cand, ms
    return best


@pytest.mark.parametrize("spec,dist", [("2x8", "long-tailed"), ("4x8", "github-64k"), ("4x8", "prolong-64k")])
def test_shortcuts_keep_the_exhaustive_choice(spec: str, dist: str) -> None:
    """best_packed's skipped CP sizes, its stop once the threshold packings' floor rises and its led sweeps'
    stops choose what finishing every packing would (the plan compared: the partitioner's, finished as plan_step
    does; no whole-document moves after: test_whole_moves.py)."""
    from zeppelin_megatron.sim.lengths import sample_steps
    cost = _cost(spec)
    tokens = cost.cluster.world_size * 8192
    batches = [long_tailed_batch(tokens, seed) for seed in range(2)] if dist == "long-tailed" else \
        sample_steps(dist, 2, tokens, 0)
    options = PlannerOptions(packed_moves=False)
    origins = set()
    for lengths in batches:
        plan = api._candidate(lengths, api.partition(lengths, cost, options), cost, options)
        got = best_packed(lengths, cost, options, plan, lambda a, ls=lengths: api._candidate(
            ls, a, cost, replace(options, remap=False)).evolve(origin="packed"))
        want = _exhaustive_packed(lengths, cost, plan)
        assert got.to_json() == want.to_json(), (spec, dist)
        origins.add(got.origin)
    assert "packed" in origins


def test_plan_step_packs_with_both_work_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each cp's packings by the head-parallel work model (same shards; and sharding from the head-parallel
    threshold) are candidates too: the plan predicts (under the comparison's charges) no slower than with the
    plain work model alone, and faster on some batch (without whole-document moves, which trade on each plan's own
    times)."""
    from zeppelin_megatron.planner import packed_search
    plain_only = packed.packed_assignments
    moveless = PlannerOptions(packed_moves=False)
    better = 0
    for seed in range(4):
        lengths = long_tailed_batch(1 << 19, seed)
        both = predict(plan_step(lengths, _cost("2x8"), moveless), _cost("2x8"), charges="zeppelin").step_ms
        with monkeypatch.context() as m:
            m.setattr(packed_search, "packed_assignments",
                      lambda ls, c, cp, first=0, **kw: plain_only(ls, c, cp, first=first))
            one = predict(plan_step(lengths, _cost("2x8"), moveless), _cost("2x8"), charges="zeppelin").step_ms
        assert both <= one + 1e-6, seed
        better += both < one - 1e-6
    assert better, "some of these batches take a packing only the head-parallel work model makes"


def test_errors_name_the_value_and_the_limit() -> None:
    cost = _cost("1x4", tokens_per_gpu=1000)
    with pytest.raises(PlanError, match="cp_size = 3 must be a positive divisor of the world size 4"):
        packed_groups([10], cost, 3)
    with pytest.raises(PlanError, match=r"sequence 1 \(1500 tokens\) does not fit one GPU \(1000 tokens\) and "
                                        r"cannot be sharded over cp = 1"):
        packed_groups([10, 1500], cost, 1)
    with pytest.raises(PlanError, match=r"fits in no group of 2000 tokens"):
        packed_groups([900] * 9, cost, 2)
    assert packed_assignments([900] * 9, cost, 2) is None
    assert quick_floor([1500], cost, 1, PlannerOptions()) == float("inf")
    with pytest.raises(PlanError, match="packed is 'yes', expected True or False"):
        PlannerOptions(packed="yes")  # type: ignore[arg-type]


LLAMA_13B = str(Path(__file__).resolve().parents[2] / "configs" / "models" / "llama_13b.yaml")
CASES = [("1x8", 1 << 18, None), ("2x8", 1 << 19, None), ("2x4", 1 << 18, LLAMA_13B), ("2x3", 1 << 17, None)]


@pytest.mark.parametrize("spec,tokens,model", CASES)
def test_floors_bound_the_finished_prediction(spec: str, tokens: int, model: str | None) -> None:
    for head_parallel in (True, False):
        options = PlannerOptions(head_parallel=head_parallel)
        for seed in range(3):
            cost = _cost(spec, model)
            lengths = long_tailed_batch(tokens, seed)
            longest = sorted(lengths, reverse=True)[:packed.QUICK]
            for cp in pack_sizes(lengths, cost.cluster):
                # every packing best_packed makes: plain or head-parallel work, and sharding from the threshold or
                # the share threshold; with head-parallel work, rings absorbing whole sequences (quick_floor told
                # so); one CP group over every rank at cp = P (quick_floor told so too)
                one = cp == cost.cluster.world_size
                froms = (None, head_parallel_threshold(lengths, cost, cp),
                         share_threshold(lengths, cost, cost.cluster.world_size))
                for shard_from, absorb in {(x, y) for x in froms for y in {False, head_parallel}}:
                    a = packed_assignments(lengths, cost, cp, head_parallel=head_parallel, shard_from=shard_from,
                                           absorb=absorb)
                    if a is None:
                        continue
                    plan = api._finish(lengths, a, cost, replace(options, remap=False))
                    assert plan.linear_layout == plan.attention_layout and plan.linear == "attention"
                    for charges in ("zeppelin", "none"):  # best_packed compares under the engine's charges
                        floor = packed_floor(lengths, a, cost, options, charges)
                        assert quick_floor(longest, cost, cp, options, charges, shard_from, absorb, one) <= floor + 1e-6
                        got = predict(plan, cost, charges=charges).step_ms
                        assert floor <= got + 1e-6, (spec, seed, cp, charges, shard_from)


def test_a_ring_floor_only_grows_with_its_sequences() -> None:
    from zeppelin_megatron.planner.grouped import ring_floor
    cost = _cost("2x8")
    rng = random.Random(0)
    for _ in range(30):
        g = rng.choice([2, 4, 8, 16])
        ranks = tuple(range(g))
        a, b = rng.randint(2 * g, 60000), rng.randint(2 * g, 60000)
        for charges in ("zeppelin", "none"):
            one, two = ring_floor(cost, ranks, [a], True, charges), ring_floor(cost, ranks, [a, b], True, charges)
            assert one[0] <= two[0] + 1e-9 and one[1] <= two[1] + 1e-9


@pytest.mark.parametrize("spec,tokens", [("1x8", 1 << 18), ("2x8", 1 << 19)])
def test_plan_step_takes_a_packed_plan_only_where_it_predicts_faster(spec: str, tokens: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    taken = 0
    for seed in range(4):
        lengths = long_tailed_batch(tokens, seed)
        cost = _cost(spec)
        plan = plan_step(lengths, cost)
        part = plan_step(lengths, cost, PlannerOptions(packed=False))
        charged = predict(plan, cost, charges="zeppelin").step_ms  # the comparison's charges (packed.CHARGES)
        assert charged <= predict(part, cost, charges="zeppelin").step_ms
        if plan != part:
            taken += 1
            assert plan.linear_layout == plan.attention_layout and plan.linear == "attention"
            assert plan.origin == "packed"
            assert charged < predict(part, cost, charges="zeppelin").step_ms - 1e-6
        # the floors change no choice: finishing every candidate gives the same plan
        with monkeypatch.context() as m:
            m.setattr(packed, "quick_floor", lambda *a, **k: 0.0)
            m.setattr(packed, "packed_floor", lambda *a, **k: 0.0)
            assert plan_step(lengths, _cost(spec)).to_json() == plan.to_json()
        # a forced token-balanced layout has no packed candidate
        assert plan_step(lengths, _cost(spec), PlannerOptions(remap=True)) == \
            plan_step(lengths, _cost(spec), PlannerOptions(remap=True, packed=False))
    assert taken, "these small batches have steps a packed plan wins (predicted)"


def test_best_packed_keeps_the_plan_without_a_prediction_or_with_remap_forced() -> None:
    cost = _cost("1x8")
    lengths = long_tailed_batch(1 << 18, 0)
    plan = plan_step(lengths, cost, PlannerOptions(packed=False))
    never = lambda a: pytest.fail("finished a candidate")  # noqa: E731
    assert best_packed(lengths, cost, PlannerOptions(remap=True), plan, never) is plan
    bare = replace(plan, predicted=None, validate=False)
    assert best_packed(lengths, cost, PlannerOptions(), bare, never) is bare


def test_origin_is_recorded_round_trips_and_is_checked() -> None:
    from zeppelin_megatron.megatron.metrics import format_step, plan_metrics, scalars, step_metrics
    from zeppelin_megatron.planner import StepPlan
    cost = _cost("1x8")
    plans = [plan_step(long_tailed_batch(1 << 18, seed), cost) for seed in range(4)]
    packed_plans = [p for p in plans if p.origin == "packed"]
    assert packed_plans and all(p.linear_layout == p.attention_layout for p in packed_plans)
    assert all(p.origin is None for p in plans if p.origin != "packed")
    doc = packed_plans[0].to_json()
    assert '"origin":"packed"' in doc.replace(" ", "")
    assert StepPlan.from_json(doc) == packed_plans[0]
    part = plan_step(long_tailed_batch(1 << 18, 0), cost, PlannerOptions(packed=False))
    assert part.origin is None and '"origin"' not in part.to_json()  # documents without it are unchanged
    with pytest.raises(PlanError, match="plan.origin is 'wlb', expected one of"):
        StepPlan.from_json(doc.replace('"origin": "packed"', '"origin": "wlb"').replace('"origin":"packed"',
                                                                                       '"origin":"wlb"'))
    with pytest.raises(PlanError, match="origin is 'x', expected None or one of"):
        replace(part, origin="x")
    m = step_metrics(1, [plan_metrics(p) for p in plans])
    assert m.packed == len(packed_plans) and scalars(m)["zeppelin/packed_micro_steps"] == len(packed_plans)
    assert f"packed {len(packed_plans)} of 4" in format_step(m)


def test_a_packing_that_rounds_a_rank_over_capacity_is_no_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 5-token sequences sharded over 2 GPUs of 5 tokens: the group has room (10), but zigzag puts 3 + 3
    tokens on the first GPU. The packing is no candidate, and the batch still gets a plan."""
    cost = _cost("1x2", tokens_per_gpu=5)
    monkeypatch.setattr(packed, "split_pays", lambda c, s, g: g > 1 and s >= 2 * g)
    assert packed_groups([5, 5], cost, 2) == [(0, 1), (0, 1)]
    assert packed_assignments([5, 5], cost, 2) is None
    plan = plan_step([5, 5], cost)
    assert max(plan.tokens(r, "attention") for r in range(2)) <= 5 and plan.origin is None


@pytest.mark.parametrize("spec,tokens", [("2x8", 1 << 19), ("4x8", 1 << 20)])
def test_engine_order_carries_what_its_reorder_keeps(spec: str, tokens: int) -> None:
    """engine_order carries the remap's per-rank totals (StepPlan.REORDER_INVARIANT) to the reordered plan;
    a prediction there equals one on the same plan with nothing derived yet (from its JSON)."""
    from zeppelin_megatron.planner import StepPlan
    for seed in range(3):
        cost = _cost(spec)
        plan = plan_step(long_tailed_batch(tokens, seed), cost, PlannerOptions(packed=False))
        assert plan.linear_layout != plan.attention_layout and "remap_pairs" in plan.__dict__  # carried
        fresh = StepPlan.from_json(plan.to_json())
        assert "remap" not in fresh.__dict__
        for charges in ("zeppelin", "none"):
            assert predict(plan, cost, charges=charges) == predict(fresh, cost, charges=charges)
        for name in StepPlan.REORDER_INVARIANT:
            assert getattr(plan, name) == getattr(fresh, name)


def test_ablation_options_leave_out_their_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """PlannerOptions(packed_leads=False): no led packing is searched; packed_threshold=False and packed_fill=False
    as well (filled leads pack the rest by threshold packings): no threshold is searched at all; each changes the
    plan of some batch where its candidate wins; bad values are named."""
    from zeppelin_megatron.planner import packed_search
    from zeppelin_megatron.sim.lengths import sample_steps
    with pytest.raises(PlanError, match="packed_leads is 1, expected True or False"):
        PlannerOptions(packed_leads=1)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="packed_threshold is 'no', expected True or False"):
        PlannerOptions(packed_threshold="no")  # type: ignore[arg-type]
    cost = _cost("4x8")
    batches = sample_steps("prolong-64k", 2, 1 << 18, 0) + sample_steps("arxiv-128k", 2, 1 << 18, 0)
    default = [plan_step(b, cost).to_json() for b in batches]

    def refuse(*_a: object, **_k: object) -> object:
        raise AssertionError("searched although left out")

    with monkeypatch.context() as m:
        m.setattr(packed_search, "lead_splits", refuse)
        no_leads = [plan_step(b, cost, PlannerOptions(packed_leads=False)).to_json() for b in batches]
        m.setattr(packed_search, "head_parallel_threshold", refuse)
        neither = [plan_step(b, cost, PlannerOptions(packed_leads=False, packed_threshold=False,
                                                     packed_fill=False)).to_json() for b in batches]
    assert no_leads != default and neither != no_leads
