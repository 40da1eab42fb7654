"""What every rank does in one simulated layer: compute ops, transfers, waits.

One layer, forward + backward merged the way the cost model times them (all
kernel times are forward + backward; a ring step moves 3x the forward K/V
bytes). Per rank, in this order:

1. linear modules, first half: ``linear_ms(linear-layout tokens) / 2``;
2. remap in (plans whose linear layout differs from the attention layout):
   the lowered ``to_attention`` exchange
   (:func:`~zeppelin_megatron.planner.lowering.lower_remaps`), ``(2 q + kv)``
   bytes per moved row (forward q, k, v in and backward output-gradient in);
   with ``remap_proxies`` each cross-node pair is split over the proxies' NICs
   as the runtime routes it (:meth:`~zeppelin_megatron.planner.lowering.RemapExchange.chains`);
   between its post and its wait the rank's ``to_attention`` remap window calls
   (:attr:`~zeppelin_megatron.planner.lowering.RankProgram.windows`, the plan's ``remap_slots``:
   staying local sequences computed from the linear rows while the exchange flows), each
   ``max(sum local_ms, call overhead)`` (label ``remap in window``) and its row copies;
3. attention, group by group in ``plan.rings`` order:

   * ``ring`` (Zeppelin, TE CP, ...): the rank's lowered forward program
     (:func:`~zeppelin_megatron.planner.lowering.lower`, what the runtime
     engine executes), op for op: ``Post`` / ``Wait`` of each ring step's K/V
     transfer (every position sends ``3 * sum ring_step_bytes`` to the next,
     over NVLink or a NIC, or along the lowered routed hops when the plan
     routes it: relays walk the ring's transfers without compute), each
     ``RingCall`` timed ``sum diag`` at step 0 and ``sum off`` after (at least
     the call overhead), each ``LocalCall`` of a slot
     (:mod:`~zeppelin_megatron.planner.local_schedule`) ``max(sum local_ms,
     call overhead)`` where the lowering puts it (a head-parallel ring's step -1
     slot between the ``Post`` and ``Wait`` of its ``heads`` all-to-all, which flows
     meanwhile), and the rank's other local sequences as one call after
     the rings.
   * ``ulysses`` (FlexSP) and ``allgather`` (TE CP's all-gather): the baselines' groups, one at a time
     (:mod:`.group_programs`; FlexSP's all-to-all permutes charged unless ``charges="none"``).

   Without ``interleave_local`` (the ``fill`` engine) local sequences leave
   the lowered program and form a queue, run as one call after the groups; with ``fill`` (simulator option)
   a rank blocked on a ring or group wait first runs local sequences from its
   queue (longest first, at least one call overhead's worth per call, not
   preempted): the three-queue engine of the paper, which
   :func:`~zeppelin_megatron.planner.predict.predict` assumes. The
   ``ulysses`` and ``allgather`` groups interleave nothing. The fill engine also queues the remap
   windows' sequences (they are in ``RankProgram.local_lens``): no window calls then.

4. remap out: attention rank -> linear rank, ``(2 q + kv)`` bytes per token; its ``to_linear``
   window calls (``remap out window``) between its post and its wait, as in step 2;
5. linear modules, second half.

Communication is :class:`Traffic`: named sets of chains of :class:`Leg` s (one
flow each); a leg starts when both its ends have posted the traffic and the
previous leg of its chain is done; a rank's wait ends when every leg it sends
or receives is done. (The lowered program's ``Transfer`` / ``Hop`` are the
runtime's messages and wire hops; a ring transfer becomes one ``Traffic``.)
"""

from __future__ import annotations

from ..planner.cost_heads import kv_heads_per_rank
from ..planner.cost_model import CostModel
from ..planner.lowering import (
    LocalCall, LocalChunk, Post, RankProgram, RemapExchange, RingCall, Transfer, Wait, lower, lower_remaps,
    message_hops,
)
from ..planner.head_parallel import lanes_share_kv
from ..planner.plan import StepPlan
from ..planner.zigzag import ring_chunk_pair_tokens
from .charges import (
    CHARGES, Shape, a2a_token_bytes, hbm_ms, shape_of, te_a2a_bytes, te_ring_bytes, te_step_bytes, wire_factor,
    ulysses_call_bytes, zeppelin_a2a_bytes, zeppelin_call_bytes, zeppelin_local_bytes, zeppelin_remap_bytes,
    zeppelin_ring_bytes,
)
from .group_programs import group_ops
from .layer_ops import Leg, LayerProgram, Op, Traffic, hop, pairs_transfer
from .peer_plan import PEER_COMMS, PeerPlan
from .peer_programs import CHARGE_LABELS
from .plain_rings import plain_rings

__all__ = ["Leg", "Traffic", "Op", "LayerProgram", "build_layer_program", "plain_rings"]


def _remap_transfer(key: tuple, cost: CostModel, remap: RemapExchange, per_token: float) -> Traffic:
    """The lowered remap exchange: direct (:func:`~.layer_ops.pairs_transfer`), or routed as the runtime routes it:
    one chain per :meth:`~zeppelin_megatron.planner.lowering.RemapExchange.chains` piece, ``src -> P_src(p)``
    (NVLink), ``P_src(p) -> P_dst(p)`` (the proxy's NIC), ``P_dst(p) -> dst`` (NVLink)."""
    if not remap.proxies:
        return pairs_transfer(key, "remap", cost, {(a, b): n * per_token for a, b, n in remap.pair_rows})
    t = Traffic(key, "remap")
    for path, rows in remap.chains(cost.cluster.gpus_per_node):
        t.chains.append([hop(cost, a, b, rows * per_token) for a, b in zip(path, path[1:])])
    return t


def _ring_transfer(lowered: Transfer, key: tuple, nbytes: float, cost: CostModel) -> Traffic:
    """A lowered ring-step transfer with ``nbytes`` per message: one chain per message part, its hops in
    round order (:func:`~zeppelin_megatron.planner.lowering.message_hops` splits whole bytes as the
    runtime splits elements)."""
    n = int(round(nbytes))
    hops = message_hops(lowered.messages, (n,) * len(lowered.messages), cost.cluster.gpus_per_node)
    chains: dict[tuple[int, int], list[Leg]] = {}
    for h in hops:
        chains.setdefault((h.msg, h.part), []).append(hop(cost, h.sender, h.receiver, h.count))
    t = Traffic(key, "ring")
    t.chains = [chains[mp] for mp in sorted(chains)]
    return t


def _ring_ops(rank: RankProgram, plan: StepPlan, cost: CostModel, keys: dict, interleave_local: bool,
              charges: str = "zeppelin") -> list[Op]:
    """One rank's lowered forward program as simulator ops: every ring step's kernel is timed as the
    cost model's diagonal (step 0) or the call's own blocks (one ``lens_q x lens_k`` block per
    sequence, :meth:`~CostModel.block_fitted_ms`: tall ``early`` and wide ``late`` blocks fitted to the
    measured blocks of their orientation) (forward + backward), a slot's local
    call as its sequences' ``local_ms``, each at least the call overhead; posts and waits name the
    ring-step transfers. Local calls go to the queue instead when ``interleave_local`` is off. A rank's
    :attr:`~zeppelin_megatron.planner.lowering.RankProgram.whole_chunk` runs on its buffers: no copies charged.
    After each call a ``copy`` op charges its merges and row copies (:mod:`.charges`, model ``charges``);
    a ring's gathers and result copies are charged at its first call.

    Head-parallel rings (``a2a = a > 1``): a lane's call has ``1/a`` of the query heads, so its kernel
    time is ``1/a`` of the full-head time (flops scale with the query heads, the cost model's rates
    carry over), at least the call overhead; its charges are counted at the lane's shape
    (``shape_of(cost, a)``); the ring's own copies (:func:`~.charges.zeppelin_a2a_bytes`) are ``copy`` ops
    before each all-to-all's ``Post`` (pack) and after its ``Wait`` (unpack) (``zeppelin`` charges; under
    ``te`` TE's all-to-all permutes instead, :func:`~.charges.te_a2a_bytes`, and TE's ring buffers at a ring's
    first call, :func:`~.charges.te_ring_bytes`)."""
    o = cost.call_overhead_ms
    sh = shape_of(cost)
    started: set[int] = set()
    shapes: dict[tuple[int, int], float] = {}

    def fitted(q: int, k: int) -> float:  # the call's block of one sequence, fitted by orientation
        hit = shapes.get((q, k))
        if hit is None:
            hit = shapes[(q, k)] = cost.block_fitted_ms(q, k)
        return hit

    ops: list[Op] = []
    label: dict[int, str] = {}
    block: dict[int, tuple[float, float]] = {}  # ring -> (diagonal, off-diagonal) step ms
    lane: dict[int, Shape] = {}  # ring -> the shape a member's calls compute with (its lane's heads)
    a2a_copies: dict[int, dict[str, float]] = {}  # head-parallel ring -> its copies around the all-to-alls
    for part in rank.rings:
        g, a = part.size, part.a2a
        label[part.ring] = (f"{part.placement} group {list(part.ranks)[:4]}{'...' if len(part.ranks) > 4 else ''} "
                            f"({len(part.lengths)} seqs{f', a2a {a}' if a > 1 else ''})")
        block[part.ring] = (sum(cost.ring_compute_profile(s, g)[0] for s in part.lengths) / a,
                            sum(cost.ring_compute_profile(s, g)[1] for s in part.lengths) / a)
        lane[part.ring] = shape_of(cost, a)
        if a > 1 and part.position is not None:
            own = part.fine_tokens(part.position * a + (part.lane or 0))
            if charges == "zeppelin":
                started.add(part.ring)  # no per-ring gathers: the all-to-alls' copies instead
                a2a_copies[part.ring] = zeppelin_a2a_bytes(sh, a, own, part.tokens(part.position),
                                                           contiguous=part.span is not None, blocks=g)
            elif charges == "te":  # TE's all-to-all: one pass each side (PEER_A2A_PASSES)
                a2a_copies[part.ring] = te_a2a_bytes(sh, a, own, part.tokens(part.position))
    for op in rank.forward:
        if isinstance(op, RingCall):
            diag, off = block[op.ring]
            if op.step == 0:
                ms = diag
            elif charges == "none":  # the simulator before the fit: the largest off-diagonal block, area-averaged
                ms = off
            else:
                ms = sum(fitted(q, k) for q, k in zip(op.lens_q, op.lens_k)) / op.part.a2a
            ops.append(Op("compute", max(ms, o), "attention", label=f"{label[op.ring]} step {op.step}"))
            copy = _call_copy_bytes(lane[op.ring], op, charges, started)
            if copy > 0:
                ops.append(Op("compute", hbm_ms(cost, copy), "copy",
                              label=f"{label[op.ring]} step {op.step} merges and row copies"))
        elif isinstance(op, LocalCall):
            if not interleave_local:
                continue
            lens = rank.local_chunks[op.chunk].lens
            ms = max(sum(cost.local_ms(n) for n in lens), o)
            if op.ring is None:
                ops.append(Op("compute", ms, "local", label="local sequences after the rings"))
            else:
                ops.append(Op("compute", ms, "local", label=f"local slot (in {label[op.ring]} step {op.step})"))
            if charges == "zeppelin" and rank.whole_chunk != op.chunk:  # whole: on the buffers, no copies
                ops.append(Op("compute", _chunk_copy_ms(cost, rank.local_chunks[op.chunk]), "copy",
                              label="local call row copies"))
        elif isinstance(op, Post):
            t = op.transfer
            if t.kind in ("heads", "tokens") and t.ring in a2a_copies:
                ops.append(Op("compute", hbm_ms(cost, a2a_copies[t.ring][f"{t.kind} pack"]), "copy",
                              label=f"{label[t.ring]} to {t.kind}: pack"))
            ops.append(Op("post", key=keys[t]))
        else:
            assert isinstance(op, Wait)
            t = op.transfer
            if t.kind in ("heads", "tokens"):
                ops.append(Op("wait", key=keys[t], kind="group", label=f"{label[t.ring]} all-to-all to {t.kind}"))
                if t.ring in a2a_copies:
                    ops.append(Op("compute", hbm_ms(cost, a2a_copies[t.ring][f"{t.kind} unpack"]), "copy",
                                  label=f"{label[t.ring]} to {t.kind}: unpack"))
                continue
            ops.append(Op("wait", key=keys[t], kind="ring", label=f"{label[t.ring]} step {t.step}"))
    return ops


def _window_ops(rank: RankProgram, direction: str, cost: CostModel, charges: str) -> list[Op]:
    """The rank's remap window calls of exchange ``direction`` (``to_attention``: remap in, ``to_linear``: remap
    out), each ``max(sum local_ms, call overhead)`` (kind ``local``), then with ``zeppelin`` charges its row
    copies (:func:`~.charges.zeppelin_local_bytes`; views when its ``linear_rows`` are one range). E.g. a window
    of sequences of 3000 and 2000 tokens at linear rows ``((0, 3000), (3000, 5000))``: one op of
    ``local_ms(3000) + local_ms(2000)``, then the contiguous copy charge of 5000 tokens."""
    ops: list[Op] = []
    name = "remap in window" if direction == "to_attention" else "remap out window"
    for w in rank.windows:
        if w.direction != direction:
            continue
        lens = rank.local_chunks[w.chunk].lens
        ops.append(Op("compute", max(sum(cost.local_ms(n) for n in lens), cost.call_overhead_ms), "local",
                      label=name))
        if charges == "zeppelin":
            ops.append(Op("compute", _chunk_copy_ms(cost, rank.local_chunks[w.chunk]), "copy",
                          label=f"{name}: row copies"))
    return ops


def _chunk_copy_ms(cost: CostModel, chunk: LocalChunk) -> float:
    """A local call's row copies (:func:`~.charges.zeppelin_local_bytes`), views when its rows are one range:
    its attention rows and, in place (``linear_rows``: q/k/v forward, dout and dq/dk/dv at the linear rows,
    q/k/v backward at the attention rows), its linear rows too."""
    one = chunk.span is not None and (chunk.linear_rows is None or chunk.linear_span is not None)
    return hbm_ms(cost, zeppelin_local_bytes(shape_of(cost), sum(chunk.lens), contiguous=one))


def _call_copy_bytes(sh: Shape, op: RingCall, charges: str, started: set[int]) -> float:
    """Bytes a ring call moves through device memory besides its kernel under charge model ``charges``;
    ``started``: rings whose first call this rank has seen (updated; its first call adds the ring's
    gathers, its first ``late`` call the backward row gathers, marked by ``-1 - ring``)."""
    if charges == "none":
        return 0.0
    if charges == "te":  # rings of more than one position: TE's ring buffers once, then every step's charges
        if op.part.size == 1:
            return 0.0
        total = 0.0
        if op.ring not in started:
            started.add(op.ring)
            total += te_ring_bytes(sh, op.part.tokens(op.position))
        return total + te_step_bytes(sh, sum(op.lens_q), sum(op.lens_k), op.kind)
    if op.part.a2a > 1 and op.part.size == 1:  # one block (Ulysses): one call, the kernel's dtype throughout
        return ulysses_call_bytes(sh, sum(op.lens_q))
    total = 0.0
    if op.ring not in started:
        started.add(op.ring)
        total += zeppelin_ring_bytes(sh, op.part.tokens(op.position), contiguous=op.part.span is not None)
    first_late = op.kind == "late" and -1 - op.ring not in started
    if first_late:
        started.add(-1 - op.ring)
    return total + zeppelin_call_bytes(sh, op, first_late=first_late)


def build_layer_program(plan: StepPlan, cost: CostModel, attention_comm: str = "ring",
                        routing: bool = True, interleave_local: bool = True,
                        charges: str = "zeppelin") -> LayerProgram:
    """Per-rank op lists and the transfers they name (see module docstring).

    ``routing=False`` ignores the plan's routes (every hop direct).
    ``interleave_local``: local sequences run in the plan's ``local_slots`` as
    the runtime engine runs them (``True``), or every local sequence goes to the
    end-of-attention queue (``False``; what the ``fill`` engine draws from).
    ``charges``: whose device-memory work ring plans pay (:mod:`.charges`): ``zeppelin`` (this
    project's engine: merges, row gathers, remap copies, fp32 dK/dV accumulators on the wire) or
    ``te`` (TE CP's fused corrections, bf16 accumulators) or ``none``. Peer programs charge TE CP's
    corrections on their rings (``none`` drops them).
    """
    if charges not in CHARGES:
        raise ValueError(f"charges is {charges!r}, expected one of {list(CHARGES)}")
    # Peer baselines (megatron-hcp, te-cp-a2a-p2p, distca) build their own programs: sim/peer_programs.py.
    if attention_comm in PEER_COMMS:
        if not isinstance(plan, PeerPlan) or plan.build is None:
            raise ValueError(f"attention_comm {attention_comm!r} needs the PeerPlan its strategy returns "
                             f"(got a {type(plan).__name__} without a peer schedule)")
        peer = plan.build(plan, cost)  # their rings pay TE CP's charges
        if charges == "none":
            peer.ops = [[o for o in ops if not o.label.endswith(CHARGE_LABELS)] for ops in peer.ops]
        return peer
    if attention_comm not in ("ring", "ulysses", "allgather"):
        raise ValueError(f"attention_comm is {attention_comm!r}, expected ring, ulysses or allgather")
    world = plan.world_size
    o = cost.call_overhead_ms
    per_token = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    ops: list[list[Op]] = [[] for _ in range(world)]
    transfers: dict[tuple, Traffic] = {}

    def add(t: Traffic) -> tuple:
        transfers[t.key] = t
        return t.key

    lin_half = [cost.linear_ms(plan.tokens(r, "linear")) / 2 for r in range(world)]
    for r in range(world):
        if lin_half[r] > 0:
            ops[r].append(Op("compute", lin_half[r], "linear", label="linear (first half)"))

    lowered = lower(plan, routing=routing) if attention_comm == "ring" else None
    remaps = lowered.remaps if lowered is not None else lower_remaps(plan)
    remap_keys: tuple[tuple, tuple] | None = None
    # Zeppelin's remap copies (none when the layouts are one; in-place chunks' rows never): half each side.
    remap_copy = ([hbm_ms(cost, x) / 2 for x in zeppelin_remap_bytes(shape_of(cost), plan, lowered.ranks)]
                  if lowered is not None and charges == "zeppelin" else [0.0] * world)
    for r in range(world):
        if remap_copy[r] > 0:
            ops[r].append(Op("compute", remap_copy[r], "copy", label="remap in: row gathers"))
    # remap windows (interleaved engine only; the fill engine queues their sequences with the other locals)
    windows = ([lowered.ranks[r] if interleave_local and lowered.ranks[r].windows else None for r in range(world)]
               if lowered is not None else [None] * world)
    if remaps is not None:  # remap in/out: the lowered exchanges
        tin = add(_remap_transfer(("remap", "in"), cost, remaps[0], per_token))
        tout = add(_remap_transfer(("remap", "out"), cost, remaps[1], per_token))
        remap_keys = (tin, tout)

    def exchange(r: int, n: int) -> list[Op]:
        """Rank ``r``'s remap in (``n = 0``) or out (1): post, its window calls, wait (windows only, no remap)."""
        inside = _window_ops(windows[r], ("to_attention", "to_linear")[n], cost, charges) if windows[r] else []
        if remap_keys is None:
            return inside
        return [Op("post", key=remap_keys[n]), *inside,
                Op("wait", key=remap_keys[n], kind="remap", label=("remap in", "remap out")[n])]
    for r in range(world):
        ops[r] += exchange(r, 0)

    local_lens: list[list[int]] = [[] for _ in range(world)]  # what the fill queue / other comms run after
    if lowered is not None:
        # Zeppelin's rings and local slots: the lowered program, K/V bytes per step from the cost model:
        # forward K/V, backward K/V and dK/dV; the engine's dK/dV accumulator travels in fp32
        # (runtime/engine.py: acc_dtype), so with ``zeppelin`` charges it weighs a/b times the K/V
        # (4x the forward payload in bf16); TE CP's stays in the training dtype (3x).
        sh = shape_of(cost)
        factor = wire_factor(sh, charges)
        keys: dict = {}
        for tid, t in lowered.transfers.items():
            ring = plan.rings[tid.ring]
            key = ("ring", ring.ranks, tid.step) if ring.a2a == 1 else ("ring", ring.ranks, ring.a2a, tid.kind)
            if ring.part:  # parts of one rank tuple (planner/ring_parts.py): each its own transfers
                key += (("part", ring.part),)
            if tid.kind in ("heads", "tokens"):  # a head-parallel ring's all-to-alls: one NVLink flow per pair,
                shared = lanes_share_kv(kv_heads_per_rank(cost), ring.a2a)  # its messages (one per run) in order
                per_token = a2a_token_bytes(shape_of(cost, ring.a2a), charges, ring.blocks,
                                            shared)[tid.kind == "tokens"]
                pairs: dict[tuple[int, int], list[int]] = {}
                for m in t.messages:
                    if m.tokens:
                        tally = pairs.setdefault((m.src, m.dst), [0, 0])
                        tally[0] += m.tokens
                        tally[1] += 1
                keys[tid] = add(Traffic(key, "group", [[hop(cost, src, dst, n * per_token, k)]
                                                      for (src, dst), (n, k) in pairs.items()]))
            elif tid.kind == "kv":  # a lane's K/V: 2 lane_kv_heads D elements per token, chunks of the blocks
                g, lane = ring.blocks, shape_of(cost, ring.a2a)
                nbytes = factor * lane.b * lane.ekv * sum(
                    ring_chunk_pair_tokens(plan.sequences[i].length, g) for i in ring.seqs)
                keys[tid] = add(_ring_transfer(t, key + (tid.step,) if ring.a2a > 1 else key, nbytes, cost))
        for r in range(world):
            ops[r] += _ring_ops(lowered.ranks[r], plan, cost, keys, interleave_local, charges)
            if not interleave_local:
                local_lens[r] = list(lowered.ranks[r].local_lens)
    else:
        for s in plan.sequences:
            if s.placement == "local":
                local_lens[s.ranks[0]].append(s.length)
        for ring in plan.rings:
            group_ops(plan, ring, cost, attention_comm, ops, add, charges)

    queue: list[list[float]] = [[] for _ in range(world)]
    for r in range(world):
        if interleave_local:
            if local_lens[r]:
                ops[r].append(Op("compute", max(sum(cost.local_ms(n) for n in local_lens[r]), o), "local",
                                 label="local sequences after the rings"))
            continue
        extra = (lambda n: hbm_ms(cost, zeppelin_local_bytes(shape_of(cost), n))) \
            if lowered is not None and charges == "zeppelin" else (lambda n: 0.0)
        queue[r] = sorted((cost.local_ms(n) + extra(n) for n in local_lens[r]), reverse=True)
        if queue[r]:
            ops[r].append(Op("local", kind="local", label="local sequences"))
    for r in range(world):
        ops[r] += exchange(r, 1)
    for r in range(world):
        if remap_copy[r] > 0:
            ops[r].append(Op("compute", remap_copy[r], "copy", label="remap out: row gathers, copies"))
    for r in range(world):
        if lin_half[r] > 0:
            ops[r].append(Op("compute", lin_half[r], "linear", label="linear (second half)"))
    return LayerProgram(ops, transfers, queue)
