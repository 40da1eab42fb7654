"""The fast acceptance of validate_plan (layout_check.py) accepts only what the full check accepts,
and every bad plan is still refused with the full check's message."""

from __future__ import annotations

import random
from dataclasses import replace
from functools import partial
from typing import Callable

import pytest

from zeppelin_megatron.planner import PlannerOptions, PlanError, StepPlan, plan_step
from zeppelin_megatron.planner import plan_check
from zeppelin_megatron.planner.layout_check import (
    attention_in_planner_order, engine_attention_layout, planner_attention_layout,
)
from zeppelin_megatron.planner.plan import SequencePlan
from zeppelin_megatron.planner.workloads import long_tailed_batch

from .conftest import make_cost

Layout = tuple[tuple[tuple[int, int, int], ...], ...]


def _verdict(make: Callable[[], StepPlan]) -> str:
    try:
        make()
    except PlanError as exc:
        return f"error: {exc}"
    return "ok"


def _both(make: Callable[[], StepPlan], monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(verdict with the fast path, verdict of the full check alone)."""
    fast = _verdict(make)
    with monkeypatch.context() as m:
        m.setattr(plan_check, "attention_in_planner_order", lambda plan: False)
        full = _verdict(make)
    return fast, full


def _plan(att: Layout, lin: Layout, base: StepPlan, **kw: object) -> StepPlan:
    return StepPlan(nodes=base.nodes, gpus_per_node=base.gpus_per_node, sequences=kw.get("sequences", base.sequences),
                    attention_layout=att, linear_layout=lin)  # type: ignore[arg-type]


def _mutable(lay: Layout) -> list[list[tuple[int, int, int]]]:
    return [list(rs) for rs in lay]


def _frozen(lay: list[list[tuple[int, int, int]]]) -> Layout:
    return tuple(tuple(rs) for rs in lay)


@pytest.fixture(scope="module")
def mixed() -> StepPlan:
    """Local, intra-node and inter-node sequences, remapped: both layouts differ."""
    cost = make_cost("2x4", tokens_per_gpu=40_000)
    plan = plan_step([100_000, 60_000, 60_000, 40_000, 3000, 900, 5], cost, PlannerOptions(packed=False))
    assert {s.placement for s in plan.sequences} == {"local", "intra_node", "inter_node"}
    assert plan.linear_layout != plan.attention_layout
    return plan


def test_planner_layouts_are_in_planner_order(mixed: StepPlan) -> None:
    assert attention_in_planner_order(mixed)
    want = _mutable(mixed.attention_layout)
    assert engine_attention_layout(mixed.sequences, mixed.rings, mixed.local_slots, 8) == want
    cost = make_cost("4x8")
    for seed in range(3):
        plan = plan_step(long_tailed_batch(1 << 20, seed), cost)
        assert attention_in_planner_order(plan)


def test_example_of_the_docstring() -> None:
    seqs = (SequencePlan(8, "intra_node", (0, 1)), SequencePlan(3, "local", (1,)))
    assert planner_attention_layout(seqs, 2) == [[(0, 0, 2), (0, 6, 8)], [(0, 2, 6), (1, 0, 3)]]
    assert planner_attention_layout([SequencePlan(3, "local", (1,)), SequencePlan(2, "local", (0,))], 2) == \
        [[(1, 0, 2)], [(0, 0, 3)]]


def test_reordered_attention_layout_is_still_valid(mixed: StepPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    att = _mutable(mixed.attention_layout)
    att[0].reverse()
    assert len(att[0]) > 1
    plan = _plan(_frozen(att), mixed.linear_layout, mixed)
    assert not attention_in_planner_order(plan)  # another order: decided by the full check, which accepts it
    assert _both(lambda: plan, monkeypatch) == ("ok", "ok")


def _local_rank(plan: StepPlan) -> tuple[int, int]:
    i = next(i for i, s in enumerate(plan.sequences) if s.placement == "local")
    return i, plan.sequences[i].ranks[0]


BadEdit = Callable[[StepPlan], tuple[Layout, Layout]]


def _att_edit(edit: Callable[[list[list[tuple[int, int, int]]], StepPlan], None]) -> BadEdit:
    def run(plan: StepPlan) -> tuple[Layout, Layout]:
        att = _mutable(plan.attention_layout)
        edit(att, plan)
        return _frozen(att), plan.linear_layout
    return run


def _lin_edit(edit: Callable[[list[list[tuple[int, int, int]]], StepPlan], None]) -> BadEdit:
    def run(plan: StepPlan) -> tuple[Layout, Layout]:
        lin = _mutable(plan.linear_layout)
        edit(lin, plan)
        return plan.attention_layout, _frozen(lin)
    return run


def _dup_local(att: list[list[tuple[int, int, int]]], plan: StepPlan) -> None:
    i, r = _local_rank(plan)
    att[(r + 1) % len(att)].append((i, 0, plan.sequences[i].length))  # a token in two ranks


def _drop_last(lay: list[list[tuple[int, int, int]]], plan: StepPlan) -> None:
    r = max(range(len(lay)), key=lambda r: len(lay[r]))
    lay[r].pop()  # a missing sequence


def _overlap(lay: list[list[tuple[int, int, int]]], plan: StepPlan) -> None:
    seq, s, e = lay[0][0]
    lay[0][0] = (seq, s, e + 1) if e < plan.sequences[seq].length else (seq, max(s - 1, 0), e)
    if lay[0][0] == (seq, s, e):
        lay[0][0] = (seq, s, e - 1)  # a whole one-token-longer range is impossible: drop a token instead


def _wrong_rank(att: list[list[tuple[int, int, int]]], plan: StepPlan) -> None:
    i, r = _local_rank(plan)
    att[r].remove((i, 0, plan.sequences[i].length))
    att[(r + 1) % len(att)].append((i, 0, plan.sequences[i].length))  # covered once, on the wrong rank


def _split_range(att: list[list[tuple[int, int, int]]], plan: StepPlan) -> None:
    i, r = _local_rank(plan)
    n = plan.sequences[i].length
    k = att[r].index((i, 0, n))
    att[r][k:k + 1] = [(i, 0, 1), (i, 1, n)] if n > 1 else [(i, 0, 1)]


def _lin_twice(lin: list[list[tuple[int, int, int]]], plan: StepPlan) -> None:
    lin[-1].append(lin[0][0])  # a token in two ranks of the linear layout only


@pytest.mark.parametrize("edit, match", [
    (_att_edit(_dup_local), "appear twice"),
    (_att_edit(_drop_last), "are missing"),
    (_att_edit(_overlap), "sequence"),
    (_att_edit(_wrong_rank), "expected the whole sequence on its rank"),
    (_lin_edit(_drop_last), "linear_layout: tokens"),
    (_lin_edit(_overlap), "linear_layout"),
    (_lin_edit(_lin_twice), "linear_layout: tokens .* appear twice"),
])
def test_bad_layouts_refused_as_by_the_full_check(mixed: StepPlan, monkeypatch: pytest.MonkeyPatch,
                                                  edit: BadEdit, match: str) -> None:
    att, lin = edit(mixed)
    fast, full = _both(lambda: _plan(att, lin, mixed), monkeypatch)
    assert fast == full and fast.startswith("error: ")
    with pytest.raises(PlanError, match=match):
        _plan(att, lin, mixed)


def test_split_whole_range_is_valid(mixed: StepPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    att, lin = _att_edit(_split_range)(mixed)  # (i, 0, 1), (i, 1, n): same tokens, not the planner's ranges
    plan = _plan(att, lin, mixed)
    assert not attention_in_planner_order(plan)
    assert _both(lambda: plan, monkeypatch) == ("ok", "ok")


def test_linear_equal_to_attention_is_checked_once(mixed: StepPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = plan_check._check_cover

    def counting(plan: StepPlan, layout: Layout, name: str) -> object:
        calls.append(name)
        return real(plan, layout, name)

    monkeypatch.setattr(plan_check, "_check_cover", counting)
    _plan(mixed.attention_layout, mixed.attention_layout, mixed)
    assert calls == []
    _plan(mixed.attention_layout, mixed.linear_layout, mixed)
    assert calls == ["linear_layout"]


def test_non_integer_rank_is_left_to_the_full_check(monkeypatch: pytest.MonkeyPatch) -> None:
    seqs = (SequencePlan(4, "local", (1.0,)), SequencePlan(2, "local", (0,)))  # type: ignore[arg-type]
    lay = (((1, 0, 2),), ((0, 0, 4),))
    assert planner_attention_layout(seqs, 2) is None
    fast, full = _both(lambda: StepPlan(nodes=1, gpus_per_node=2, sequences=seqs, attention_layout=lay,
                                        linear_layout=lay), monkeypatch)
    assert fast == full


def test_random_edits_agree_with_the_full_check(mixed: StepPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(0)
    n = len(mixed.sequences)
    verdicts = set()
    for _ in range(300):
        att, lin = _mutable(mixed.attention_layout), _mutable(mixed.linear_layout)
        seqs = list(mixed.sequences)
        for _ in range(rng.randint(1, 2)):
            lay = rng.choice((att, att, lin))
            r = rng.randrange(len(lay))
            kind = rng.randrange(6)
            if kind == 0 and lay[r]:
                lay[r].pop(rng.randrange(len(lay[r])))
            elif kind == 1 and lay[r]:
                seq, s, e = lay[r][rng.randrange(len(lay[r]))]
                lay[rng.randrange(len(lay))].append((seq, s, e + rng.choice((-1, 1))))
            elif kind == 2 and lay[r]:
                k = rng.randrange(len(lay[r]))
                lay[rng.randrange(len(lay))].append(lay[r].pop(k))
            elif kind == 3:
                rng.shuffle(lay[r])
            elif kind == 4:
                i = rng.randrange(n)
                if seqs[i].placement == "local":
                    seqs[i] = replace(seqs[i], ranks=(rng.randrange(len(att)),))
            else:
                lay[r].append((rng.randrange(n + 1), 0, rng.randint(1, 3)))
        fast, full = _both(partial(StepPlan, nodes=mixed.nodes, gpus_per_node=mixed.gpus_per_node,
                                   sequences=tuple(seqs), attention_layout=_frozen(att),
                                   linear_layout=_frozen(lin)), monkeypatch)
        assert fast == full
        verdicts.add(fast == "ok")
    assert verdicts == {True, False}  # both outcomes were exercised
