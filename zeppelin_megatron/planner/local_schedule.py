"""Where each rank's local sequences run among its ring steps (the plan's ``local_slots``).

A rank spends part of every layer blocked in its rings: waiting for a ring
partner still busy in an earlier ring (rings run in one global order, see
:func:`~.plan.ring_order`), or for a transfer slower than the step's kernel.
The paper's engine fills that time from a queue of local (single-GPU)
sequences. The runtime cannot react to waits it cannot see ahead of time (a
GPU stream runs what the host queued), so the planner decides in advance:

1. :func:`ring_timeline` estimates, per layer (forward + backward, the cost
   model's units), when every rank posts each ring step and how long it then
   idles. Ring ``k`` member at position ``p`` posts step ``j`` at
   ``post[p][j]``: step 0 when it is free of its earlier rings, step ``j + 1``
   after its step-``j`` kernel (``c_j = max(diag or off, overhead)``) and the
   step's transfers are done. A hop ``p -> p+1`` starts when every rank it
   touches (both ends, and routing relays) has posted the step, and lasts
   ``nvlink_ms`` (one node) or ``routed_ms`` (over its route's proxies; one NIC
   unrouted), with no contention. The member's *gap* at step ``j`` is
   ``max(0, done_j - (post[p][j] + c_j))``, where ``done_j`` is when the last
   hop it sends or receives ends. Relays post like members, without kernels.
   A head-parallel ring (:mod:`.head_parallel`) steps over its blocks (its
   lanes' hops, :func:`~.cost_heads.lane_hops`), between its two all-to-alls,
   which each block starts when all its lanes are there. A member posts its
   ``heads`` all-to-all when it is free and waits until the block's last lane
   is there and the all-to-all is done: that wait, ``heads`` ms plus how much
   earlier than its last lane it arrived, is its gap at step ``-1`` (a slot
   between ``Post`` and ``Wait`` of ``heads``, :class:`~.plan.LocalSlot`), the
   only gap of a Ulysses ring (one block, no step with a transfer).
2. :func:`schedule_local` packs each rank's local sequences into its gaps,
   best fit, largest first: a sequence goes to the gap whose call
   (``max(sum of its sequences' local_ms, overhead)``) still fits with the least
   room left (ties: the earlier ring, then the earlier step). A call that fits
   its gap delays nothing (the rank would have waited anyway), so the estimated
   timeline stays valid as slots are filled.
3. A sequence that fits no gap goes where it overflows least: the slot whose
   call would exceed its gap by the least, among the rank's gaps and step 0 of
   its *filling* ring, a ring none of whose members is in a later ring
   (:func:`filling_rings`; they share no rank, so a rank has at most one); on a
   tie the filling ring, where the overflow holds up no later ring (step
   ``-1`` of a Ulysses filling ring, which has no step 0 with a wait). A gap of
   a ring that does not fill is a candidate only when the call overflows it by
   at most the gap itself: the overflow holds the ring's partners (and their
   later rings) up, which is worth it only while the call hides at least as
   much as it delays (Llama-7B arxiv-128k on 64 GPUs, simulated: 47 ms of local
   work in a 4 ms gap held a partner's 45 ms ring up; the step went from 4438
   to 3299 ms once it ran after the rings instead). Nothing
   else is put in a slot that overflowed. The estimate can be short of the real
   wait (contention, routing relays), so a long sequence often still hides
   there, and the rank starts its share of the layout all-to-all (the remap)
   sooner than after its rings. A rank with neither gaps nor a filling ring
   runs such sequences after its rings.

Worked example (one node of 4 GPUs, overhead ``o``): rings in queue order
``A = (0, 1)`` and ``B = (1, 2)``, each one step of kernel ``c`` then a transfer
``t < c``, then the last step: rank 2 posts ``B`` step 0 at 0, runs its
diagonal kernel (``c``) and waits for rank 1, which only posts ``B`` at ``2c``
(``A`` took it two kernels): rank 2's gap at ``B`` step 0 is about
``2c + t - c = c + t``, so its local sequences worth up to ``c + t`` run there
instead of after the rings.

Head-parallel example (same ``o``): a Ulysses ring ``(2, 3)`` after ring ``(0, 3)``:
rank 2 is free at 0, rank 3 at ``T``; rank 2 posts ``heads`` at 0 and the
all-to-all ends at ``T + h``: rank 2's gap at step ``-1`` is ``T + h``, rank 3's
``h``; rank 2's local sequences worth up to ``T + h`` run inside the all-to-all.

Deterministic: plain float arithmetic in a fixed order, explicit tie-breaks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .cost_heads import head_ring_time, lane_hops
from .plan import LocalSlot, StepPlan
from .routing import route_parts
from .zigzag import next_position

if TYPE_CHECKING:
    from .cost_model import CostModel

__all__ = ["filling_rings", "ring_timeline", "schedule_local", "with_local_slots"]


def filling_rings(rings: Sequence[Sequence[int]]) -> tuple[bool, ...]:
    """Per ring (member ranks, in queue order): True when no member is in a later ring.

    Example: rings ``[(0, 1), (2, 3), (1, 2)]`` -> ``(False, False, True)``
    (ranks 1 and 2 go on to ring ``(1, 2)``).
    """
    out: list[bool] = []
    later: set[int] = set()
    for ranks in reversed(rings):
        out.append(not later.intersection(ranks))
        later.update(ranks)
    return tuple(reversed(out))


def _hops(plan: StepPlan, ring_ranks: Sequence[int], nbytes: float,
          cost: "CostModel") -> list[tuple[tuple[int, ...], float]]:
    """``(ranks the hop touches, ms)`` for every hop ``p -> p+1`` of one ring step."""
    cl = cost.cluster
    g = len(ring_ranks)
    routes = plan.routes_for(ring_ranks)
    out: list[tuple[tuple[int, ...], float]] = []
    for p, src in enumerate(ring_ranks):
        dst = ring_ranks[next_position(p, g)]
        if cl.node_of(src) == cl.node_of(dst):
            out.append(((src, dst), cost.nvlink_ms(nbytes)))
            continue
        route = routes.get((src, dst))
        if route is None:
            out.append(((src, dst), cost.routed_ms(nbytes, 1)))
            continue
        relays = tuple(r for rp in route_parts(route, len(route.proxies), cl.gpus_per_node) for r in rp.relays)
        out.append(((src, dst) + relays, cost.routed_ms(nbytes, len(route.proxies))))
    return out


def ring_timeline(plan: StepPlan, cost: "CostModel", arrive: dict[tuple[int, int], float] | None = None,
                  ) -> tuple[dict[tuple[int, int, int], float], list[float]]:
    """``(gaps, free)``: ``gaps[(rank, ring index, step)]`` = estimated idle ms of a member after
    its step kernel (steps ``0 .. g-2``; head-parallel rings: ``-1``, the ``heads`` all-to-all's
    wait, then ``0 .. blocks-2``); ``free[rank]`` = when its last ring ends. Per layer,
    no local work (see the module docstring). ``arrive`` (filled when given): ``arrive[(rank, ring
    index)]`` = when the member is free of its earlier rings."""
    o = cost.call_overhead_ms
    free = [0.0] * plan.world_size
    gaps: dict[tuple[int, int, int], float] = {}
    for k, ring in enumerate(plan.rings):
        if arrive is not None:
            arrive.update({(r, k): free[r] for r in ring.ranks})
        if ring.a2a > 1:
            _head_timeline(plan, cost, k, free, gaps)
            continue
        g = len(ring.ranks)
        diag = off = 0.0
        step_bytes = 0
        for i in ring.seqs:
            s = plan.sequences[i].length
            d, f = cost.ring_compute_profile(s, g)
            diag, off, step_bytes = diag + d, off + f, step_bytes + cost.ring_step_bytes(s, g)
        _plain_steps(ring.ranks, k, _hops(plan, ring.ranks, 3 * step_bytes, cost), diag, off, o, free, gaps)
    return gaps, free


def _plain_steps(ranks: tuple[int, ...], k: int, hops: list[tuple[tuple[int, ...], float]], diag: float,
                 off: float, o: float, free: list[float], gaps: dict[tuple[int, int, int], float]) -> None:
    """:func:`ring_timeline`'s steps of plain ring ``k`` over ``ranks`` (updates ``free`` and ``gaps``).
    ``hops[p]`` (:func:`_hops`): position ``p``'s hop to ``p + 1``, the ranks it touches (source,
    destination, then any relays) and its ms. At each step a hop starts when every rank it touches is
    free (``post``) and ends ``ms`` later; a rank is done with the step when every hop touching it has
    ended, and a member's step ends at the later of that and its kernel (``max(diag or off, o)``), its
    gap the difference. Relays outside the ring only wait for their hops.

    Indices: positions ``0 .. g-1`` are the members in ring order, relays outside the ring follow, so hop
    ``p`` always joins positions ``p`` and ``(p + 1) % g`` and only the relayed hops need a loop.
    Example: ``g = 2``, both free at 0, hops of 3 ms, ``diag`` 1 (``o`` below it): step 0 ends at 3 for
    both, gaps ``2``; then the last kernel, ``free = 3 + max(off, o)``."""
    g = len(ranks)
    at = {r: p for p, r in enumerate(ranks)}
    extra: list[int] = []  # relays outside the ring, by index - g
    relayed: list[tuple[int, tuple[int, ...]]] = []  # (hop, its relays' indices)
    for p, (touched, _) in enumerate(hops):
        if len(touched) > 2:
            idx = []
            for r in touched[2:]:
                if r not in at:
                    at[r] = g + len(extra)
                    extra.append(r)
                idx.append(at[r])
            relayed.append((p, tuple(idx)))
    hop_ms = [ms for _, ms in hops]
    post = [free[r] for r in ranks] + [free[r] for r in extra]
    prev: list[float] = []
    for j in range(g - 1):
        c = max(diag if j == 0 else off, o)
        if j >= 2:  # steps 1 .. g-2 are one map (kernel ``off``): once it shifted every rank alike, it repeats
            shift = [x - y for x, y in zip(post, prev)]
            if max(shift) - min(shift) <= _STEADY_MS:
                _repeat_steps(ranks, k, j, g - 1, gaps, post, shift[0])
                break
        prev = post
        start = [a if a > b else b for a, b in zip(post, post[1:g] + post[:1])]  # zip stops at g
        for h, via in relayed:
            for i in via:
                if post[i] > start[h]:
                    start[h] = post[i]
        ends = [x + ms for x, ms in zip(start, hop_ms)]
        done = [a if a > b else b for a, b in zip(ends, ends[-1:] + ends[:-1])] + [0.0] * len(extra)
        for h, via in relayed:
            for i in via:
                if ends[h] > done[i]:
                    done[i] = ends[h]
        post = _end_step(ranks, k, j, done, post, c, gaps) + [d if d > x else x for d, x in zip(done[g:], post[g:])]
    last = max(off, o)  # rings have g >= 2
    for r, x in zip(ranks, post):
        free[r] = x + last
    for r, x in zip(extra, post[g:]):
        free[r] = x


def _end_step(ranks: tuple[int, ...], k: int, j: int, done: list[float], post: list[float], c: float,
              gaps: dict[tuple[int, int, int], float]) -> list[float]:
    """The end of step ``j`` of ring ``k`` for its members (``ranks``, by position; ``done`` / ``post`` indexed
    alike, longer lists cut to the members): each is free at the later of its hops' end (``done``) and its
    kernel's (``post + c``), and waits the difference (``gaps[(rank, k, j)]``, 0 when the kernel ends last).
    Returns the members' new ``post``. Example: ``done = [5.0]``, ``post = [1.0]``, ``c = 3``: gap 1, ``[5.0]``."""
    ready = [x + c for x in post[:len(ranks)]]
    gaps.update(zip([(r, k, j) for r in ranks], [d - x if d > x else 0.0 for d, x in zip(done, ready)]))
    return [d if d > x else x for d, x in zip(done, ready)]


_STEADY_MS = 1e-9
"""How alike (ms) every rank's shift over one ring step must be for :func:`_plain_steps` to take the
ring as steady (its later steps then repeat the last one, shifted)."""


def _repeat_steps(ranks: tuple[int, ...], k: int, j: int, end: int, gaps: dict[tuple[int, int, int], float],
                  post: list[float], shift: float) -> None:
    """Steps ``j .. end-1`` of a steady plain ring (:func:`_plain_steps`; ``post``: every index's time
    after step ``j - 1``, updated in place): the step map is max-plus, so a map that moved every index
    by ``shift`` moves it by ``shift`` again, with the same gaps as step ``j - 1``. Example: a ring whose
    members each wait 0.4 ms at step 3 and end it 1.1 ms after step 2 waits 0.4 ms at every later step."""
    same = [gaps[(r, k, j - 1)] for r in ranks]
    for step in range(j, end):
        gaps.update(zip([(r, k, step) for r in ranks], same))
    n = end - j
    post[:] = [x + n * shift for x in post]


def _head_timeline(plan: StepPlan, cost: "CostModel", k: int, free: list[float],
                   gaps: dict[tuple[int, int, int], float]) -> None:
    """:func:`ring_timeline` of head-parallel ring ``k`` (updates ``free`` and ``gaps``): each block
    starts its ``heads`` all-to-all when all its lanes are free and ends it ``heads_ms`` later (a
    member's gap at step ``-1``: from when it is free to that end); then
    the steps over the ``m`` blocks as for a plain ring (lane hops :func:`~.cost_heads.lane_hops`, gaps
    at steps ``0 .. m-2``); after the last kernel each block's ``tokens`` all-to-all starts when all
    its lanes are done. A ring of one block (Ulysses) has no step with a transfer: its only gap is ``-1``."""
    ring = plan.rings[k]
    ranks, a, m = ring.ranks, ring.a2a, ring.blocks
    o = cost.call_overhead_ms
    h = head_ring_time(cost, ranks, [plan.sequences[i].length for i in ring.seqs], a)
    post = [free[r] for r in ranks]  # by ring position
    blocks = [range(b * a, (b + 1) * a) for b in range(m)]
    for blk in blocks:
        start = max(post[p] for p in blk) + h.heads_ms
        for p in blk:
            gaps[(ranks[p], k, -1)] = start - post[p]
            post[p] = start
    hops = lane_hops(cost, ranks, a, h.lane_bytes) if m > 1 else []
    for j in range(m - 1):
        c = max(h.diag if j == 0 else h.off, o)
        done = [0.0] * len(ranks)
        for p, q, ms in hops:  # (hot: conditionals, not max())
            end = (post[p] if post[p] > post[q] else post[q]) + ms
            if end > done[p]:
                done[p] = end
            if end > done[q]:
                done[q] = end
        post = _end_step(ranks, k, j, done, post, c, gaps)
    last = max(h.off if m > 1 else h.diag, o)
    for blk in blocks:
        end = max(post[p] for p in blk) + last + h.tokens_ms
        for p in blk:
            free[ranks[p]] = end


def schedule_local(plan: StepPlan, cost: "CostModel") -> tuple[LocalSlot, ...]:
    """Local slots for ``plan`` (see the module docstring), ordered by rank, ring, step."""
    o = cost.call_overhead_ms
    gaps, _ = ring_timeline(plan, cost)
    by_rank: dict[int, list[tuple[int, int, float]]] = {}
    for (r, k, j), gap in gaps.items():  # inserted ring by ring, step by step: (k, j) order per rank
        if gap > o:  # a call shorter than the overhead does not exist
            by_rank.setdefault(r, []).append((k, j, gap))
    filling: dict[int, tuple[int, int]] = {}  # rank -> its filling ring's first slot with a wait
    fills = filling_rings([ring.ranks for ring in plan.rings])
    for k, ring in enumerate(plan.rings):
        if fills[k]:  # a Ulysses ring (one block) has no step 0: its slot is the heads all-to-all's (-1)
            filling.update(dict.fromkeys(ring.ranks, (k, 0 if ring.blocks > 1 else -1)))
    local: dict[int, list[int]] = {}
    for i, s in enumerate(plan.sequences):
        if s.placement == "local" and (s.ranks[0] in by_rank or s.ranks[0] in filling):
            local.setdefault(s.ranks[0], []).append(i)
    slots: list[LocalSlot] = []
    for r in sorted(local):
        ms = {i: cost.local_ms(plan.sequences[i].length) for i in local[r]}
        used: dict[tuple[int, int], float] = {}
        chosen: dict[tuple[int, int], list[int]] = {}
        for i in sorted(local[r], key=lambda i: (-ms[i], i)):
            best: tuple[float, int, int] | None = None
            for k, j, gap in by_rank.get(r, ()):
                room = gap - max(used.get((k, j), 0.0) + ms[i], o)
                if room >= 0 and (best is None or room < best[0]):
                    best = (room, k, j)
            if best is not None:
                key = best[1:]
                used[key] = used.get(key, 0.0) + ms[i]
                chosen.setdefault(key, []).append(i)
                continue
            # fits no gap: the least overflow, the filling ring's first slot on a tie (then no room left there)
            options = list(by_rank.get(r, ()))
            if r in filling:
                options.append((*filling[r], gaps.get((r, *filling[r]), 0.0)))
            least: tuple[float, int, int, int] | None = None
            for k, j, gap in options:
                over = max(used.get((k, j), 0.0) + ms[i], o) - gap
                if over > gap and not fills[k]:  # would hold up the partners' later rings more than it hides
                    continue
                option = (over, 0 if (k, j) == filling.get(r) else 1, k, j)
                if least is None or option < least:
                    least = option
            if least is not None:
                key = least[2:]
                used[key] = float("inf")
                chosen.setdefault(key, []).append(i)
        slots += [LocalSlot(r, k, j, tuple(sorted(seqs))) for (k, j), seqs in sorted(chosen.items())]
    return tuple(slots)


def with_local_slots(plan: StepPlan, cost: "CostModel") -> StepPlan:
    """``plan`` with :func:`schedule_local`'s slots (its other fields unchanged)."""
    return plan.evolve(local_slots=schedule_local(plan, cost))
