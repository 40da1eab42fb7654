"""Packed candidates after their trades: :func:`trades`, :func:`traded` and :func:`trade_floor`.

:func:`~.packed_search.best_packed` finishes packed candidates in the order of their floors and keeps the one whose
predicted step is lowest; :mod:`.whole_moves` then trades whole documents off that plan's busiest ranks. The trades
can change the ranking: a candidate whose step is a few percent higher before them can end lower after, where its
excess sits on ranks that hold whole documents (movable) and the best one's on ranks that hold only rings (Llama-7B
prolong-128k on 128 GPUs, batch 1 of docs/BENCHMARKS.md: the kept candidate, 1889.9 ms under the engine's charges,
leads with the two longest documents on 48 ranks and leaves the third, 92.2k tokens, alone on a ring of 16 ranks that
no trade lowers; the same lead with that document on a wide span of 32 ranks in the rest predicts 1911.5 ms before
its trades and 1793.5 after: simulated 1800 ms against 1886).

With ``PlannerOptions.packed_rerank`` (opt-in), :func:`~.packed_search.best_packed` therefore ranks candidates
after their trades (*post-trade ranking*): the search before trades runs as without it, then the kept candidate is
traded (:func:`traded`: its step after trades, exact, and the trades) and the search goes on: every candidate already
finished, and every one the queue holds or its families make up to :data:`~.packed_search.REACH` above the lowest
step after trades so far, whose :func:`trade_floor` is below that step, is finished (where not yet) and traded; the
lowest step after trades wins (ties: the earlier). Led packings then also offer their rest with wide spans (made during
the search, queued only for the ranking), the placement of the example above. Since the search before trades is
unchanged, the plan never predicts above the default's (on docs/BENCHMARKS.md's 120 steps under the engine's
charges: lower on 30, by up to 5.1%).

:func:`trade_floor` estimates how low trades can bring a placement's step without finishing it: trades move whole
documents between ranks, which keeps the sum of the ranks' work (about: a document's row copies differ by rank), so
the step after them is about the mean of the ranks' layers as :func:`~.packed.packed_floor` bounds them. An
estimate, not a bound: on the 120 steps the step after trades was 0.97-1.13x it (896 finished candidates within 5% of
the best before trades, mean 1.005x). A rank holding only rings keeps its work unless a ring move or join
(:mod:`.whole_moves`) changes its rings, but the estimate does not take such ranks' layers as a floor: ring moves and
joins lower them often enough that such a floor passed over winners (the 60 configurations' steps simulated 0.06%
faster on average with it, 0.13% without, before the led packings' wide spans were added).

Pure and deterministic.
"""

from __future__ import annotations

from typing import Sequence

from .cost_model import CostModel
from .grouped import layer_floors
from .options import PlannerOptions
from .partition_context import Assignment
from .plan import StepPlan
from .predict import predict
from .ring_parts import split_rings
from .whole_moves import Moved, move_whole

__all__ = ["trade_floor", "trades", "traded"]


def trade_floor(lengths: Sequence[int], assignments: Sequence[Assignment], cost: CostModel, options: PlannerOptions,
                charges: str) -> float:
    """An estimate of the lowest step :func:`~.whole_moves.move_whole` can reach from ``assignments`` (module
    docstring): ``L * mean_r f_r``, ``f_r`` rank ``r``'s layer as :func:`~.packed.packed_floor` bounds it under
    ``charges`` (:func:`~.grouped.layer_floors`: ``max(tot_r, own_r + loc_r) + linear_ms(t_r)``); at most
    :func:`~.packed.packed_floor`, ``L * max_r f_r``.

    Example (``charges="none"``, no call overhead, no linear time, ``local_ms(s) = s / 1000``, 4 ranks, one layer):
    whole documents of 6000, 2000, 2000 and 2000 tokens on ranks 0-3: ``f = (6, 2, 2, 2)``: 3 ms (no trade reaches
    it: 6000 moved anywhere leaves a rank at 8; the estimate says what the work would allow)."""
    return cost.model.layers * sum(layer_floors(lengths, assignments, cost, options, charges)) / cost.cluster.world_size


def trades(lengths: Sequence[int], assignments: Sequence[Assignment], plan: StepPlan, cost: CostModel,
           options: PlannerOptions, charges: str) -> tuple[StepPlan, Moved | None]:
    """``plan`` (finished from ``assignments``, linear layout = attention layout) as ``plan_step`` runs it (rings in
    parts where that pays, :func:`~.ring_parts.split_rings`, when ``options.ring_parts`` and ``head_parallel`` are
    on), and its trades under ``charges`` (:func:`~.whole_moves.move_whole`; ``None``: none lowers its step)."""
    parts = options.ring_parts and options.head_parallel
    ran = split_rings(plan, cost) if parts else plan
    return ran, move_whole(lengths, assignments, ran, cost, charges, parts=parts)


def traded(lengths: Sequence[int], assignments: Sequence[Assignment], plan: StepPlan, step_ms: float,
           cost: CostModel, options: PlannerOptions, charges: str) -> tuple[float, Moved | None]:
    """:func:`trades`, and the step predicted under ``charges`` after them (``step_ms``: ``plan``'s step under
    ``charges``, not in parts): the traded step, or without trades ``plan``'s in parts."""
    ran, moved = trades(lengths, assignments, plan, cost, options, charges)
    if moved is not None:
        return moved.after_ms, moved
    if ran is plan:
        return step_ms, None
    return predict(ran, cost, charges=charges).step_ms, None
