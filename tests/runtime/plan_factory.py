"""Hand-built random step plans for runtime tests (no planner policy involved).

Plans mix long inter-node rings (random rank order, spanning >= 2 nodes),
medium intra-node rings, and many short local sequences (a long-tailed length
mix); ranks often sit in several rings; attention-layout ranges are shuffled
and local sequences are sometimes cut into pieces, so the runtime cannot rely
on any layout convention beyond what the plan states. With ``local_slots``,
about half of each rank's local sequences run in random ring steps of its rings
(``StepPlan.local_slots``; in a head-parallel ring also step -1, inside its ``heads``
all-to-all, half of the slots of a rank in such a ring), the rest after the rings. Multi-node plans with
``routing`` often route their remap over a random set of proxies
(``StepPlan.remap_proxies``).
"""

from __future__ import annotations

import random

from dataclasses import replace

from zeppelin_megatron.planner.plan import LocalSlot, SequencePlan, StepPlan
from zeppelin_megatron.planner.routing import Route
from zeppelin_megatron.planner.zigzag import zigzag_ranges


def random_plan(
    seed: int,
    nodes: int,
    gpus_per_node: int,
    *,
    n_local: int = 10,
    n_intra_rings: int = 2,
    n_inter_rings: int = 2,
    routing: bool = True,
    max_len: int = 96,
    local_slots: bool = True,
    n_head_rings: int = 0,
    head_widths: tuple[int, ...] = (),
) -> StepPlan:
    """``n_head_rings`` head-parallel rings (``a2a`` from ``head_widths``, default every width >= 2 that
    divides ``gpus_per_node``): one block (Ulysses, ``intra_node``) or blocks on distinct random nodes
    (hybrid, ``inter_node``), random GPUs in each node. They come after the other rings in the
    random stream, so ``n_head_rings=0`` gives the plans it always gave."""
    rng = random.Random(seed)
    world = nodes * gpus_per_node
    node_of = lambda r: r // gpus_per_node  # noqa: E731
    seqs: list[SequencePlan] = []

    def add_ring(ranks: list[int], placement: str, lo: int, hi: int, a2a: int = 1) -> None:
        g = len(ranks)
        for _ in range(rng.choice([1, 1, 2])):
            seqs.append(SequencePlan(rng.randint(max(2 * g, lo), max(2 * g, hi)), placement, tuple(ranks), a2a))

    if nodes >= 2:
        for _ in range(n_inter_rings):
            g = rng.randint(2, world)
            while True:
                ranks = rng.sample(range(world), g)
                if len({node_of(r) for r in ranks}) >= 2:
                    break
            add_ring(ranks, "inter_node", max_len // 2, max_len)
    if gpus_per_node >= 2:
        for _ in range(n_intra_rings):
            node = rng.randrange(nodes)
            g = rng.randint(2, gpus_per_node)
            ranks = rng.sample([node * gpus_per_node + l for l in range(gpus_per_node)], g)
            add_ring(ranks, "intra_node", max_len // 4, max_len // 2)
    widths = head_widths or tuple(w for w in range(2, gpus_per_node + 1) if gpus_per_node % w == 0)
    for _ in range(n_head_rings if widths else 0):
        w = rng.choice(widths)
        blocks = rng.randint(1, nodes)
        ranks = [n * gpus_per_node + l for n in rng.sample(range(nodes), blocks)
                 for l in rng.sample(range(gpus_per_node), w)]
        add_ring(ranks, "inter_node" if blocks > 1 else "intra_node", max_len // 4, max_len, a2a=w)
    for _ in range(n_local):
        length = min(max_len // 4, int(rng.paretovariate(1.2) * 2))
        seqs.append(SequencePlan(max(1, length), "local", (rng.randrange(world),)))
    rng.shuffle(seqs)

    att: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    for i, s in enumerate(seqs):
        if s.placement == "local":
            cuts = sorted(rng.sample(range(1, s.length), min(s.length - 1, rng.randint(0, 2))))
            bounds = [0, *cuts, s.length]
            att[s.ranks[0]] += [(i, a, b) for a, b in zip(bounds, bounds[1:])]
        else:
            for pos, r in enumerate(s.ranks):
                (a0, a1), (b0, b1) = zigzag_ranges(s.length, len(s.ranks), pos)
                att[r] += [(i, a0, a1), (i, b0, b1)]
    for ranges in att:
        rng.shuffle(ranges)

    total = sum(s.length for s in seqs)
    order = list(range(len(seqs)))
    rng.shuffle(order)
    cuts = sorted(rng.randint(0, total) for _ in range(world - 1))
    lin = cut_in_order([s.length for s in seqs], order, [*cuts, total], world)

    routes: list[Route] = []
    if routing:
        seen: set[tuple[tuple[int, ...], int, int]] = set()
        for s in seqs:
            if s.placement != "inter_node" or s.ranks in {k[0] for k in seen}:
                continue
            g = len(s.ranks)
            for p in range(g):
                src, dst = s.ranks[p], s.ranks[(p + 1) % g]
                if node_of(src) == node_of(dst) or rng.random() < 0.2:
                    continue
                others = [l for l in range(gpus_per_node) if l != src % gpus_per_node]
                extra = rng.sample(others, rng.randint(0, len(others))) if others else []
                routes.append(Route(s.ranks, src, dst, (src % gpus_per_node, *extra)))
                seen.add((s.ranks, src, dst))
    plan = StepPlan(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        sequences=tuple(seqs),
        attention_layout=tuple(tuple(r) for r in att),
        linear_layout=tuple(tuple(r) for r in lin),
        routing=tuple(routes),
    )
    if routing and nodes >= 2 and rng.random() < 0.7:
        proxies = rng.sample(range(gpus_per_node), rng.randint(1, gpus_per_node))
        plan = replace(plan, remap_proxies=tuple(proxies))
    if not local_slots:
        return plan
    steps = {r: [(k, j) for k, ring in enumerate(plan.rings) if r in ring.ranks
                 for j in range(-1 if ring.a2a > 1 else 0, ring.blocks - 1)]  # -1: inside the heads all-to-all
             for r in range(world)}
    chosen: dict[tuple[int, int, int], list[int]] = {}
    for i, s in enumerate(seqs):
        r = s.ranks[0]
        if s.placement == "local" and steps[r] and rng.random() < 0.5:
            inside = [kj for kj in steps[r] if kj[1] == -1]  # half of these in a heads all-to-all when possible
            k, j = rng.choice(inside if inside and rng.random() < 0.5 else steps[r])
            chosen.setdefault((r, k, j), []).append(i)
    return replace(plan, local_slots=tuple(LocalSlot(r, k, j, tuple(v)) for (r, k, j), v in sorted(chosen.items())))


def placements(plan: StepPlan) -> set[str]:
    return {s.placement for s in plan.sequences}


def cut_in_order(lengths: list[int], order: list[int], bounds: list[int],
                 world: int) -> list[list[tuple[int, int, int]]]:
    """Sequences ``order`` laid end to end and cut at ``bounds`` (cumulative token counts, the last the
    total): rank ``r`` gets the ranges between ``bounds[r - 1]`` and ``bounds[r]``. Example: lengths
    ``[3, 4]``, order ``[1, 0]``, bounds ``[5, 7]``: ``[[(1, 0, 4), (0, 0, 1)], [(0, 1, 3)]]``."""
    lin: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    pos = rank = 0
    for i in order:
        start = 0
        while start < lengths[i]:
            while pos >= bounds[rank]:
                rank += 1
            take = min(lengths[i] - start, bounds[rank] - pos)
            lin[rank].append((i, start, start + take))
            start, pos = start + take, pos + take
    return lin


def small_batch(seed: int, world: int, tokens_per_gpu: int = 96) -> list[int]:
    """One long sequence, one medium and up to 12 short ones, within 95% of ``world * tokens_per_gpu``
    tokens: the batches of the ``plan_step`` plans the runtime tests run."""
    rng = random.Random(seed)
    lens = [rng.randint(100, tokens_per_gpu * world - 60), rng.randint(30, 120)] + \
        [rng.randint(1, 12) for _ in range(12)]
    while sum(lens) > world * tokens_per_gpu * 0.95:
        lens.pop()
    return lens
