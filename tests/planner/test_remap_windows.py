"""Remap windows (issue 12 item 3, planning side): staying local sequences computed while a layout
exchange is in flight (planner/remap_windows.py, StepPlan.remap_slots, RankProgram.windows)."""

from __future__ import annotations

from functools import lru_cache

import pytest

from zeppelin_megatron.planner import CostModel, PlanError, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.lowering import LocalCall, lower, lower_remaps
from zeppelin_megatron.planner.plan import RemapSlot, SequencePlan, StepPlan
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.planner.remap_windows import remap_slots, staying_sequences, window_ms
from zeppelin_megatron.planner.workloads import long_tailed_batch

CASES = [("2x8", 1 << 19, 0), ("2x8", 1 << 19, 3), ("4x8", 1 << 20, 1), ("4x8", 1 << 20, 4)]


@lru_cache(maxsize=None)
def _cost(spec: str) -> CostModel:
    return CostModel(model=load_model(None), cluster=load_cluster(spec))


@lru_cache(maxsize=None)
def _plan(spec: str, tokens: int, seed: int, overlap: bool = True) -> StepPlan:
    return plan_step(long_tailed_batch(tokens, seed), _cost(spec),
                     PlannerOptions(remap=True, remap_overlap=overlap))


def _reference_wait(plan: StepPlan, cost: CostModel, direction: int) -> list[float]:
    """Per rank, path by path from the lowered exchange's chains (RemapExchange.chains; a direct
    cross-node row through the source's rail GPU, as sim/program.py sends it): each hop a leg, NVLink
    inside a node, the sending GPU's NIC across; a leg lasts its busier port's load."""
    g = plan.gpus_per_node
    nic = cost.cluster.gpu_nic
    per_row = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    remaps = lower_remaps(plan)
    assert remaps is not None
    paths = []
    for path, rows in remaps[direction].chains(g):  # direct cross-node: via the source's rail GPU (PXN)
        if len(path) == 2 and path[0] // g != path[1] // g:
            rail = path[1] // g * g + path[0] % g
            path = (path[0], rail) + ((path[1],) if rail != path[1] else ())
        paths.append((path, rows))

    def ports(s: int, d: int) -> tuple[tuple[str, int], tuple[str, int]]:
        if s // g == d // g:
            return ("nvl_out", s), ("nvl_in", d)
        return ("nic_out", s // g * 100 + nic[s % g]), ("nic_in", d // g * 100 + nic[s % g])

    load: dict[tuple[str, int], int] = {}
    for path, rows in paths:
        for s, d in zip(path, path[1:]):
            for p in ports(s, d):
                load[p] = load.get(p, 0) + rows
    wait = [0.0] * plan.world_size
    for path, _rows in paths:
        end = 0.0
        for s, d in zip(path, path[1:]):
            end += max((cost.nic_ms if p[0].startswith("nic") else cost.nvlink_ms)(load[p] * per_row)
                       for p in ports(s, d))
            wait[s], wait[d] = max(wait[s], end), max(wait[d], end)
    return wait


@pytest.mark.parametrize("case", CASES)
def test_window_ms_matches_a_path_by_path_reference(case: tuple[str, int, int]) -> None:
    plan, cost = _plan(*case), _cost(case[0])
    for proxies in ((), (0, 1, 2, 3, 4, 5, 6, 7)):
        p = plan.evolve(remap_proxies=proxies)
        got = window_ms(p, cost)
        for d in (0, 1):
            assert got[d] == pytest.approx(_reference_wait(p, cost, d), rel=1e-9, abs=1e-12)
    assert window_ms(plan.evolve(linear_layout=plan.attention_layout), cost) == ([0.0] * 16 if case[0] == "2x8"
                                                                               else [0.0] * 32,) * 2


@pytest.mark.parametrize("case", CASES)
def test_windows_hold_staying_sequences_that_fit(case: tuple[str, int, int]) -> None:
    plan, cost = _plan(*case), _cost(case[0])
    assert plan.remap_slots, "these batches remap and have staying local sequences"
    gaps = window_ms(plan, cost)
    staying = staying_sequences(plan)
    o = cost.call_overhead_ms
    seen: set[int] = set()
    for x in plan.remap_slots:
        assert set(x.seqs) <= set(staying[x.rank])
        gap = gaps[0 if x.direction == "to_attention" else 1][x.rank]
        assert max(sum(cost.local_ms(plan.sequences[i].length) for i in x.seqs), o) <= gap + 1e-9
        assert not seen & set(x.seqs)
        seen |= set(x.seqs)
    assert not seen & {i for x in plan.local_slots for i in x.seqs}
    # every local sequence runs exactly once: a LocalCall of forward (and backward) or a window
    low = lower(plan)
    for rp in low.ranks:
        for ops in (rp.forward, rp.backward):
            ran = [i for op in ops if isinstance(op, LocalCall) for i in rp.local_chunks[op.chunk].seqs]
            ran += [i for w in rp.windows for i in rp.local_chunks[w.chunk].seqs]
            mine = [i for i, s in enumerate(plan.sequences) if s.placement == "local" and s.ranks == (rp.rank,)]
            assert sorted(ran) == mine
    # deterministic, and the JSON keeps the slots
    again = plan_step(long_tailed_batch(case[1], case[2]), _cost(case[0]), PlannerOptions(remap=True))
    assert again.to_json() == plan.to_json()
    back = StepPlan.from_json(plan.to_json())
    assert back.remap_slots == plan.remap_slots and back.digest() == plan.digest()


@pytest.mark.parametrize("case", CASES)
def test_windows_lower_the_prediction_and_can_be_turned_off(case: tuple[str, int, int]) -> None:
    plan, cost = _plan(*case), _cost(case[0])
    off = _plan(*case, overlap=False)
    assert off.remap_slots == ()
    assert "remap_slots" not in off.to_dict()
    assert plan.predicted is not None and off.predicted is not None
    assert plan.predicted.step_ms <= off.predicted.step_ms
    # the same plan without its windows (their sequences after the rings) predicts no lower
    bare = plan.evolve(remap_slots=(), predicted=None)
    assert predict(plan.evolve(predicted=None), cost).step_ms <= predict(bare, cost).step_ms


def test_window_calls_read_linear_rows() -> None:
    plan = _plan("2x8", 1 << 19, 0)
    low = lower(plan)
    n = 0
    staying = staying_sequences(plan)
    for rp in low.ranks:  # a chunk of staying sequences only knows its linear rows (windows' chunks too)
        for c in rp.local_chunks:
            assert (c.linear_rows is not None) == all(i in staying.get(rp.rank, ()) for i in c.seqs)
    for rp in low.ranks:
        assert [w.direction for w in rp.windows] == sorted((w.direction for w in rp.windows),
                                                         key=lambda d: d != "to_attention")
        for w in rp.windows:
            chunk = rp.local_chunks[w.chunk]
            starts = {}
            row = 0
            for i, a, b in plan.linear_layout[rp.rank]:
                starts[(i, a, b)] = row
                row += b - a
            for i, length, (lo, hi) in zip(chunk.seqs, chunk.lens, w.linear_rows):
                assert (lo, hi) == (starts[(i, 0, length)], starts[(i, 0, length)] + length)
            n += 1
    assert n > 0


def _two_rank_plan(slots: tuple[RemapSlot, ...]) -> StepPlan:
    """1 x 2 GPUs: sequences 0 (6 tokens) and 1 (4) local on rank 0, 2 (2) on rank 1; the linear layout
    moves 4 rows of sequence 0 to rank 1, so only sequence 1 stays whole on rank 0, and 2 on rank 1."""
    seqs = (SequencePlan(6, "local", (0,)), SequencePlan(4, "local", (0,)), SequencePlan(2, "local", (1,)))
    att = (((0, 0, 6), (1, 0, 4)), ((2, 0, 2),))
    lin = (((0, 0, 2), (1, 0, 4)), ((0, 2, 6), (2, 0, 2)))
    return StepPlan(nodes=1, gpus_per_node=2, sequences=seqs, attention_layout=att, linear_layout=lin,
                    remap_slots=slots)


def test_bad_remap_slots_are_named() -> None:
    plan = _two_rank_plan((RemapSlot(0, "to_attention", (1,)), RemapSlot(1, "to_linear", (2,))))
    assert staying_sequences(plan) == {0: [1], 1: [2]}
    low = lower(plan)
    assert low.ranks[0].windows[0].linear_rows == ((2, 6),)
    assert low.ranks[0].local_chunks[0].linear_rows is None  # sequence 0 moves
    assert low.ranks[0].local_chunks[1].linear_rows == ((2, 6),) and low.ranks[0].local_chunks[1].linear_span == (2, 6)
    assert low.ranks[1].windows[0].linear_rows == ((4, 6),)
    bad = {
        "not whole on rank 0 in the linear layout": (RemapSlot(0, "to_attention", (0,)),),
        "direction 'sideways'": (RemapSlot(0, "sideways", (1,)),),
        "is not a local sequence of rank 1": (RemapSlot(1, "to_attention", (1,)),),
        "a second slot of rank 0": (RemapSlot(0, "to_linear", (1,)), RemapSlot(0, "to_linear", (1,))),
        "already in remap_slots[0]": (RemapSlot(0, "to_linear", (1,)), RemapSlot(0, "to_attention", (1,))),
        "outside [0, 2)": (RemapSlot(5, "to_linear", (1,)),),
        "no sequences": (RemapSlot(0, "to_linear", ()),),
    }
    for message, slots in bad.items():
        with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            _two_rank_plan(slots)
    same = StepPlan(nodes=1, gpus_per_node=2, sequences=plan.sequences, attention_layout=plan.attention_layout,
                    linear_layout=plan.attention_layout)
    with pytest.raises(PlanError, match="no exchange to overlap"):
        same.evolve(remap_slots=(RemapSlot(0, "to_linear", (1,)),))
    # a layout change drops the windows unless they are given
    assert plan.evolve(linear_layout=plan.attention_layout).remap_slots == ()


def test_window_ms_worked_example() -> None:
    """The module docstring's two-node case, larger: 60000 rows 0 -> 1 over one NIC each way; rank 0's
    staying 3-token sequence fits a window, and goes to the first of two equal ones."""
    cost = CostModel(model=load_model(None), cluster=load_cluster("2x1"))
    seqs = (SequencePlan(60000, "local", (1,)), SequencePlan(3, "local", (0,)))
    plan = StepPlan(nodes=2, gpus_per_node=1, sequences=seqs, attention_layout=(((1, 0, 3),), ((0, 0, 60000),)),
                    linear_layout=(((0, 0, 60000), (1, 0, 3)), ()))
    t = cost.nic_ms(60000 * (2 * cost.q_bytes_per_token + cost.kv_bytes_per_token))
    assert window_ms(plan, cost) == ([t, t], [t, t])
    assert max(cost.local_ms(3), cost.call_overhead_ms) <= t
    slots, local = remap_slots(plan, cost)
    assert slots == (RemapSlot(0, "to_attention", (1,)),) and local == ()


def test_remap_slots_in_json_are_checked() -> None:
    import json
    plan = _two_rank_plan((RemapSlot(0, "to_attention", (1,)),))
    doc = plan.to_dict()
    assert doc["remap_slots"] == [{"rank": 0, "direction": "to_attention", "seqs": [1]}]
    for bad, message in (({"rank": 0, "direction": 5, "seqs": [1]}, "remap_slots\\[0\\].direction must be a string"),
                         ({"rank": 0, "direction": "to_linear", "seqs": ["a"]},
                          "remap_slots\\[0\\].seqs must be integers"),
                         ({"rank": 0, "direction": "inward", "seqs": [1]}, "direction 'inward'"),
                         ([1], "remap_slots\\[0\\]: expected an object")):
        with pytest.raises(PlanError, match=message):
            StepPlan.from_json(json.dumps(dict(doc, remap_slots=[bad])))
