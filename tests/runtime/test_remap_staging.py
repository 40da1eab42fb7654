"""The remap without staging copies (planner/remap_staging.py, used by runtime/remap.py): every rank's
phases replayed in memory across all ranks from the gathers alone give each rank its destination layout,
row for row, routed and direct; the docstring example; fewer rows read than the staging buffers copy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from plan_factory import random_plan

from zeppelin_megatron.planner.lowering import rank_remap
from zeppelin_megatron.planner.plan import StepPlan
from zeppelin_megatron.planner.remap_routing import RoutedExchange, RoutedPhase
from zeppelin_megatron.planner.remap_staging import Gather, gather_plan, rank_staging, staging_plan


def _labels(plan: StepPlan, rank: int, layout: str) -> np.ndarray:
    """Token ids ``seq * 10**6 + position`` of ``rank``'s buffer in ``layout``."""
    ranges = plan.linear_layout[rank] if layout == "linear" else plan.attention_layout[rank]
    return np.concatenate([np.arange(r[1], r[2]) + 10**6 * r[0] for r in ranges] or [np.zeros(0, np.int64)])


def _apply(g: Gather, sources: list[np.ndarray], n: int) -> np.ndarray:
    if len(g) == 1 and g[0][2] is None:
        o, rows, _ = g[0]
        return sources[o] if rows is None else sources[o][rows]
    out = np.full(n, -1, dtype=np.int64)
    for o, rows, pos in g:
        out[pos] = sources[o] if rows is None else sources[o][rows]
    return out


def _all_to_all(bufs: list[np.ndarray], send: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Rank ``a`` sends its rows grouped by destination (``send[a][b]`` rows to ``b``)."""
    world = len(bufs)
    starts = [np.concatenate([[0], np.cumsum(c)]) for c in send]
    return [np.concatenate([bufs[a][starts[a][b]:starts[a][b + 1]] for a in range(world)]) for b in range(world)]


@pytest.mark.parametrize("seed,nodes,gpn", [(s, n, g) for s in range(4) for n, g in ((2, 2), (2, 4), (4, 2))])
@pytest.mark.parametrize("direction", ["to_attention", "to_linear"])
def test_gathers_deliver_the_destination_layout(seed: int, nodes: int, gpn: int, direction: str) -> None:
    plan = random_plan(seed, nodes, gpn)
    if not plan.remap_proxies:
        plan = replace(plan, remap_proxies=tuple(range(0, gpn, 2)))
    src, dst = ("linear", "attention") if direction == "to_attention" else ("attention", "linear")
    world = plan.world_size
    lowered = [rank_remap(plan, r, direction) for r in range(world)]  # type: ignore[arg-type]
    assert all(routed is not None for _, routed in lowered)
    plans = [rank_staging(ex, routed, plan.tokens(r, src), plan.tokens(r, dst))
             for r, (ex, routed) in enumerate(lowered)]
    for r, (ex, routed) in enumerate(lowered):  # staying rows never enter the send buffer nor a phase
        assert ex.send_counts[r] == ex.recv_counts[r] == 0 and routed is not None
        labels = _labels(plan, r, src)
        sent = set(labels[np.asarray(ex.send_index, dtype=np.int64)].tolist())
        assert not sent & set(labels[ex.keep_src].tolist())
        assert all(p.send_counts[r] == p.recv_counts[r] == 0 for p in routed.phases)
    sources = [[_labels(plan, r, src)[np.asarray(ex.send_index, dtype=np.int64)]] for r, (ex, _) in enumerate(lowered)]
    for t in range(3):
        bufs = [_apply(plans[r].phases[t], sources[r], int(sum(lowered[r][1].phases[t].send_counts)))
                for r in range(world)]
        got = _all_to_all(bufs, [lowered[r][1].phases[t].send_counts for r in range(world)])
        for r in range(world):
            assert len(got[r]) == plans[r].sizes[t + 1]
            sources[r].append(got[r])
    moved = copied = 0
    for r in range(world):
        y = _apply(plans[r].final, sources[r] + [_labels(plan, r, src)], plan.tokens(r, dst))
        assert np.array_equal(y, _labels(plan, r, dst)), f"rank {r} {direction}"
        phase_rows, final_rows = plans[r].rows_read()
        moved += phase_rows
        copied += sum(len(p.send_index) + len(p.keep_index) + plans[r].sizes[t + 1]
                      for t, p in enumerate(lowered[r][1].phases))  # the staging buffers' copies
    assert moved < copied


@pytest.mark.parametrize("seed,nodes,gpn", [(s, n, g) for s in range(3) for n, g in ((1, 2), (2, 2), (2, 4))])
@pytest.mark.parametrize("direction", ["to_attention", "to_linear"])
def test_direct_gathers_keep_staying_rows_out_of_the_exchange(seed: int, nodes: int, gpn: int,
                                                              direction: str) -> None:
    """Direct: one all_to_all of the moving rows only; the staying rows come from the source buffer."""
    plan = replace(random_plan(seed, nodes, gpn), remap_proxies=())
    src, dst = ("linear", "attention") if direction == "to_attention" else ("attention", "linear")
    world = plan.world_size
    lowered = [rank_remap(plan, r, direction)[0] for r in range(world)]  # type: ignore[arg-type]
    plans = [rank_staging(ex, None, plan.tokens(r, src), plan.tokens(r, dst)) for r, ex in enumerate(lowered)]
    send = [_labels(plan, r, src)[np.asarray(ex.send_index, dtype=np.int64)] for r, ex in enumerate(lowered)]
    got = _all_to_all(send, [ex.send_counts for ex in lowered])
    staying = 0
    for r, ex in enumerate(lowered):
        assert ex.send_counts[r] == 0 and plans[r].sizes == (len(send[r]), len(got[r]), plan.tokens(r, src))
        y = _apply(plans[r].final, [send[r], got[r], _labels(plan, r, src)], plan.tokens(r, dst))
        assert np.array_equal(y, _labels(plan, r, dst)), f"rank {r} {direction}"
        staying += len(ex.keep_src)
        assert len(ex.keep_src) + sum(ex.send_counts) == plan.tokens(r, src)
    assert staying > 0  # random plans keep some rows in place
    with pytest.raises(ValueError, match="not each of the destination"):
        rank_staging(lowered[0], None, plan.tokens(0, src), plan.tokens(0, dst) + 1)


def test_docstring_example() -> None:
    empty = np.zeros(0, dtype=np.int64)
    keep2 = np.arange(2)
    routed = RoutedExchange(phases=(
        RoutedPhase(send_counts=(0,), send_index=empty, recv_counts=(1,), keep_index=keep2),  # buf_1: s0 s1 g1
        RoutedPhase(send_counts=(0,), send_index=empty, recv_counts=(0,), keep_index=np.arange(3)),
        RoutedPhase(send_counts=(0,), send_index=empty, recv_counts=(1,), keep_index=np.arange(3)),  # + g3
    ), final_index=np.array([3, 1, 2, 0]))
    st = staging_plan(routed, 2, np.array([3, 1, 2, 0]))
    assert st.sizes == (2, 1, 0, 1, 0)
    assert st.phases == ((), (), ())
    (o0, r0, p0), (o1, r1, p1), (o3, r3, p3) = st.final
    assert (o0, r0.tolist(), p0.tolist()) == (0, [1, 0], [1, 3])
    assert (o1, r1, p1.tolist()) == (1, None, [2]) and (o3, r3, p3.tolist()) == (3, None, [0])
    assert gather_plan(np.array([1, 1]), np.array([0, 1]), (5, 2)) == ((1, None, None),)
    with pytest.raises(ValueError, match="one entry per result row"):
        gather_plan(np.array([1]), np.array([0, 1]), (5, 2))


def test_drop_rows_and_in_place_rows_examples() -> None:
    """In-place chunks' destination rows leave the final gather (docstring examples); a direct plan's rows
    still land where the layout says once the caller fills the dropped ones."""
    from zeppelin_megatron.planner.lowering_parts import LocalChunk
    from zeppelin_megatron.planner.remap_staging import StagingPlan, drop_rows, in_place_rows

    st = StagingPlan(sizes=(0, 4, 0), phases=(), final=((1, None, None),))
    (o, r, p), = drop_rows(st, np.array([1, 2]), 4).final
    assert (o, r.tolist(), p.tolist()) == (1, [0, 3], [0, 3])
    assert drop_rows(st, np.zeros(0, np.int64), 4) is st
    chunk = LocalChunk(seqs=(7,), lens=(4,), layout=((7, 0, 4),), linear_rows=((5, 9),))
    other = LocalChunk(seqs=(3,), lens=(2,), layout=((7, 0, 4), (3, 0, 2)))
    assert in_place_rows([chunk, other], "to_attention").tolist() == [0, 1, 2, 3]
    assert in_place_rows([chunk, other], "to_linear").tolist() == [5, 6, 7, 8]
    plan = replace(random_plan(0, 1, 2), remap_proxies=())
    for r in range(2):
        ex, _ = rank_remap(plan, r, "to_attention")
        full = rank_staging(ex, None, plan.tokens(r, "linear"), plan.tokens(r, "attention"))
        drop = np.arange(0, plan.tokens(r, "attention"), 3)
        part = drop_rows(full, drop, plan.tokens(r, "attention"))
        assert all(pos is not None for _, _, pos in part.final)
        got = sorted(int(x) for _, _, pos in part.final for x in pos)
        assert got == sorted(set(range(plan.tokens(r, "attention"))) - set(drop.tolist()))
