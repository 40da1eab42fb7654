"""best_packed's best-first search (planner/packed_search.py, module docstring): after the uniform packings, the
candidates (at their floors) and the led, filled-lead and wide families still to make (at their bounds) wait in one
queue; the lowest is finished or made until the lowest is at or above the best step so far."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model
from zeppelin_megatron.planner import packed_search as ps
from zeppelin_megatron.planner.partition_context import Assignment, assignments_of

LENGTHS = [6000] * 16


def _search(monkeypatch: pytest.MonkeyPatch, steps: dict[str, float], *, lead_bound: float, fill_bound: float,
            floor: float = 100.0, wide: tuple[float, ...] = ()) -> tuple[list[str], str]:
    """Run best_packed on a stand-in search: the uniform sweep makes one candidate ``A`` (floor ``floor``, defers a
    wide packing per bound of ``wide``), one leading and one filled-lead family with the given bounds (each makes
    its candidate, floors 1 above their bounds), finished candidates predicting ``steps``, the bar ``steps["bar"]``.
    Returns the events in order (a family made, a candidate finished) and the plan kept."""
    cost = CostModel(model=load_model(None), cluster=load_cluster("2x8"))
    events: list[str] = []
    made = {name: [Assignment("local", (r,)) for r in range(16)] for name in ("A", "lead", "fill", "wide")}
    made["lead"][0] = Assignment("intra_node", (0, 1))  # four different placements (the search skips repeats)
    made["fill"][1] = Assignment("intra_node", (0, 1))
    made["wide"][2] = Assignment("intra_node", (2, 3))
    name_of = {tuple(a): name for name, a in made.items()}
    floors = {"A": floor, "lead": lead_bound + 1, "fill": fill_bound + 1, "wide": (wide[0] + 1) if wide else 0.0}

    def sweep(lengths: Any, cost: Any, options: Any, best_ms: float, first: int, emit: Any, **kw: Any) -> None:
        emit(made["A"], 2)
        kw["defer"].extend((b, 2, 3000, ((0, 4),)) for b in wide)

    def family(name: str) -> Any:
        def run(*a: Any) -> Any:
            events.append(f"make {name}")
            found = floors[name], 2, made[name]
            return ([found], []) if name == "lead" else found  # _led: (its packings, its wide-span rests)
        return run

    def finish(assignments: Any, widths: Any = None) -> object:
        name = name_of[tuple(assignments)]
        events.append(f"finish {name}")
        return SimpleNamespace(name=name)

    monkeypatch.setattr(ps, "_sweep", sweep)
    monkeypatch.setattr(ps, "lead_splits", lambda lengths, cost: [(8, [0, 1])])
    monkeypatch.setattr(ps, "fill_splits", lambda lengths, cost: [(4, [2])])
    monkeypatch.setattr(ps, "lead_floor", lambda top, k, cost, options: lead_bound if k == 8 else fill_bound)
    monkeypatch.setattr(ps, "_led", family("lead"))
    monkeypatch.setattr(ps, "_filled", family("fill"))
    monkeypatch.setattr(ps, "packed_floor", lambda lengths, a, cost, options: floors[name_of[tuple(a)]])
    monkeypatch.setattr(ps, "packed_assignments", lambda *a, **k: (events.append("make wide"), made["wide"])[1])
    monkeypatch.setattr(ps, "predict", lambda plan, cost, charges="none": SimpleNamespace(step_ms=steps[plan.name]))
    bar = SimpleNamespace(name="bar", predicted=object())
    kept = ps.best_packed(LENGTHS, cost, PlannerOptions(packed_moves=False), bar, finish)  # type: ignore[arg-type]
    return events, kept.name  # type: ignore[attr-defined]


def test_a_family_above_a_finished_step_is_never_made(monkeypatch: pytest.MonkeyPatch) -> None:
    # the filled lead (bound 90) is made before A (floor 100) and its candidate (floor 91) finished: 130; A then
    # predicts 120, below the leading family's bound 150, which is never made (made before any finish until then)
    events, kept = _search(monkeypatch, {"bar": 1000.0, "A": 120.0, "fill": 130.0}, lead_bound=150.0, fill_bound=90.0)
    assert events == ["make fill", "finish fill", "finish A"] and kept == "A"


def test_a_family_below_the_best_step_is_made_and_can_win(monkeypatch: pytest.MonkeyPatch) -> None:
    events, kept = _search(monkeypatch, {"bar": 1000.0, "A": 160.0, "fill": 170.0, "lead": 155.0},
                           lead_bound=150.0, fill_bound=90.0)
    assert events == ["make fill", "finish fill", "finish A", "make lead", "finish lead"] and kept == "lead"


def test_nothing_below_the_bar_is_finished_or_made(monkeypatch: pytest.MonkeyPatch) -> None:
    events, kept = _search(monkeypatch, {"bar": 80.0}, lead_bound=150.0, fill_bound=90.0)
    assert events == [] and kept == "bar"


def test_wide_packings_wait_for_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # a wide packing bounded at 95 is made before A (floor 100) is finished; one at 130 is ruled out by A's 120
    events, _ = _search(monkeypatch, {"bar": 1000.0, "A": 120.0, "wide": 125.0}, lead_bound=150.0, fill_bound=200.0,
                        wide=(95.0,))
    assert events == ["make wide", "finish wide", "finish A"]
    events, _ = _search(monkeypatch, {"bar": 1000.0, "A": 120.0}, lead_bound=150.0, fill_bound=200.0, wide=(130.0,))
    assert events == ["finish A"]


def test_assignments_of_names_each_placement_once_per_rank_tuple() -> None:
    cluster = load_cluster("2x8")
    got = assignments_of([(3,), (0, 1), (6, 7, 8, 9), (0, 1), (3,)], cluster)
    assert [a.placement for a in got] == ["local", "intra_node", "inter_node", "intra_node", "local"]
    assert got[1] is got[3] and got[0] is got[4] and got[2].ranks == (6, 7, 8, 9)
