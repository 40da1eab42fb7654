"""Device-memory work of the peers' attention engines, in bytes: what the simulator charges the baselines.

The twin of :mod:`.engine_costs` (Zeppelin's engine, counted from this project's runtime) for the engines the
baselines run, each read from its own code; same notation (``b``, ``a``, ``Eq``, ``Ekv``, ``Hq``) and the same
``bytes / hbm_GBps`` charge (:func:`~.engine_costs.hbm_ms`). The simulator re-exports these
(:mod:`zeppelin_megatron.sim.charges`) and charges them op by op; the planner prices them under
``charges="te"`` (:mod:`.engine_ring`, :mod:`.cost_heads`). Pure: the planner's own modules only.

**Transformer Engine CP's ring** (``te-cp``, ``te-cp-routing``, ``wlb-llm``, ``hybrid-dp``,
``megatron-hcp``, the ring of ``te-cp-a2a-p2p``; :func:`te_step_bytes`, :func:`te_ring_bytes`): our reading of
``AttnFuncWithCPAndKVP2P`` on THD inputs (Megatron's packed sequences) in bf16 with the flash-attn backend, at
TE's main branch of 2026-08 (``d0067d0``, 2.20.0.dev0; the version ``te-cp-a2a-p2p`` needs, THD being new to
hierarchical CP there). Per step, forward + backward, ``T`` query rows of the step, ``T_kv`` K/V rows:

* the running output is kept in the training dtype and corrected once per step after the ring
  (``thd_out_correction``: r ``out``, r ``out_per_step``, w ``out``: ``3 b T Eq``, the diagonal step's too);
  the log-sum-exp merged in fp32 (``5 a T Hq``; ``4 a T Hq`` at the diagonal: the clone and the reads);
* backward accumulates dQ (``3 b T Eq``) and dK/dV (``3 b T_kv Ekv``) in the training dtype, in the received
  buffer (``thd_grad_correction`` for half rows);
* THD has no views of half tensors: a step that uses half of K/V (``early``) copies those halves forward and
  backward (``thd_read_half_tensor``: ``4 b T_kv Ekv``), a step that uses half of Q (``late``) copies the
  query half forward and the q, out, dout halves backward (``8 b T Eq``);
* once per ring (rings of more than one position): K and V packed into the first send buffer
  (``torch.cat``, ``2 b n Ekv``), the output's zeros (``b n Eq``), backward's copy of K/V into its
  send buffer (``2 b n Ekv``) and the half log-sum-exp (``a n Hq``).

The FusedAttention (cuDNN) backend adds per-step zero fills of the output and the gradients and log-sum-exp
transposes: not charged (in TE's favour). TE before 2026 kept the running output in fp32 (``a`` bytes: more
per output element, no half copies on BSHD); this reading is one version of a moving target.

**The peers' Ulysses all-to-alls** (``flexsp``; the all-to-all of ``te-cp-a2a-p2p``; Zeppelin's head-parallel
rings under ``charges="te"``): the full read + write passes their code makes around each all-to-all,
:data:`PEER_A2A_PASSES` (TE: one pass on each side; FlexSP: one, on the side whose permute moves data),
:func:`peer_a2a_bytes` per pass, :func:`te_a2a_bytes` by :data:`~.engine_costs.A2A_PARTS`.

Not charged (favouring those baselines): TE's BSHD chunk reorder (a second pass; Megatron's packed sequences are
THD), the copies of TE's all-gather CP (``allgather-cp``).
"""

from __future__ import annotations

from .engine_costs import Shape, lane_shape

__all__ = ["TE_STEP_KINDS", "te_step_bytes", "te_ring_bytes", "PEER_A2A_PASSES", "peer_a2a_bytes",
           "peer_a2a_permutes", "te_a2a_bytes"]


TE_STEP_KINDS: tuple[str, ...] = ("diag", "early", "late")
"""A TE ring step's kind: ``diag`` (step 0), ``early`` (all query rows, the source's early K/V half), ``late``
(the late query half, all of the source's K/V), as the lowering's ``RingCall.kind``."""


def te_step_bytes(sh: Shape, q_rows: float, kv_rows: float, kind: str) -> float:
    """TE CP's ring: one step's corrections, accumulations and half-tensor copies, forward + backward (module
    docstring), ``q_rows`` query rows and ``kv_rows`` K/V rows of the step. Raises ``ValueError`` for a ``kind``
    not in :data:`TE_STEP_KINDS`. Example (Llama-7B bf16, ``Eq = 4096``, ``Ekv = 8192``, ``Hq = 32``): an
    ``early`` step of 1024 query and 512 K/V rows: ``6*2*1024*4096 + 3*2*512*8192 + 5*4*1024*32 +
    4*2*512*8192 = 109.7 MB``."""
    if kind not in TE_STEP_KINDS:
        raise ValueError(f"TE ring step kind is {kind!r}, expected one of {list(TE_STEP_KINDS)}")
    a, b = sh.a, sh.b
    base = 6 * b * q_rows * sh.eq + 3 * b * kv_rows * sh.ekv  # output correction, dQ and dK/dV accumulation
    if kind == "diag":
        return float(base + 4 * a * q_rows * sh.hq)
    half = 4 * b * kv_rows * sh.ekv if kind == "early" else 8 * b * q_rows * sh.eq
    return float(base + 5 * a * q_rows * sh.hq + half)


def te_ring_bytes(sh: Shape, rows: float) -> float:
    """TE CP's ring, once per ring and member of ``rows`` ring rows (rings of more than one position): the
    forward's ``torch.cat`` of K and V into the first send buffer (``2 b Ekv``), its output zeros (``b Eq``),
    the backward's copy of K/V into its send buffer (``2 b Ekv``) and half log-sum-exp (``a Hq``) per row
    (what Zeppelin's engine pays for its packed K/V buffer is :func:`~.engine_costs.zeppelin_ring_bytes`).
    Example (Llama-7B bf16): 1000 rows: ``1000 * (2 * (4096 + 4 * 8192) + 4 * 32) = 73.9 MB``."""
    return float(rows * (sh.b * (sh.eq + 4 * sh.ekv) + sh.a * sh.hq))


PEER_A2A_PASSES: dict[str, dict[str, tuple[int, int]]] = {"te": {"in": (1, 1), "out": (1, 1)},
                                                         "ulysses": {"in": (1, 0), "out": (0, 1)}}
"""Full read + write passes a peer's Ulysses all-to-all makes over what it carries, ``(sender, receiver)`` per
direction: ``in`` (heads scattered: q, k, v forward, the output gradient backward), ``out`` (heads gathered: the
output forward, dq, dk, dv backward). Read from the peers' code (no copy of it here):

* ``te`` (TE CP's ``a2a`` and the all-to-all of ``a2a+p2p``, ``flash_attn_a2a_communicate`` in
  ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``, THD, the format Megatron's
  packed sequences use): before each ``all_to_all_single`` the sender's ``movedim(...).contiguous()`` (before
  attention) or THD reorder kernel (after), after it the receiver's THD reorder kernel (before attention) or
  ``movedim(...).contiguous()`` (after): one pass each side (BSHD adds a chunk reorder: not charged).
* ``ulysses`` (FlexSP: Hetu-Galvatron's ``flexsp`` branch, ``single_all_to_all`` in
  ``galvatron/core/tensor_parallel/transformer.py``, a packed batch of one): heads scattered, the sender's
  ``permute(...).contiguous()``, while the receiver's permute moves only the size-1 batch dimension (no copy);
  heads gathered, the reverse.
"""


def peer_a2a_bytes(sh: Shape, tokens: float, passes: int = 1) -> float:
    """Bytes of ``passes`` read + write passes over one direction of a Ulysses all-to-all (:data:`PEER_A2A_PASSES`)
    for ``tokens`` tokens of ``sh``'s heads, forward + backward merged (``2 Eq + Ekv`` elements per token in the
    training dtype): ``2 passes b (2 Eq + Ekv) tokens``. Example (Llama-7B bf16, ``Eq = 4096``, ``Ekv = 8192``):
    32768 tokens, one pass: ``2 * 2 * 16384 * 32768 = 2.15 GB`` -> 0.73 ms at 2951.7 GB/s."""
    return 2.0 * passes * sh.b * (2 * sh.eq + sh.ekv) * tokens


def peer_a2a_permutes(sh: Shape, kind: str, own: float, got: float) -> dict[tuple[str, int], float]:
    """A Ulysses group member's permute bytes around its two all-to-alls by ``(direction, side)`` (side 0: the
    sender's copy before the post, 1: the receiver's after the wait), :data:`PEER_A2A_PASSES` ``kind`` passes:
    ``in`` sends the member's ``own`` tokens (all heads) and receives ``got`` tokens' worth, ``out`` the reverse.
    Example (``kind = "ulysses"``): ``{("in", 0): peer_a2a_bytes(sh, own), ("in", 1): 0, ("out", 0): 0,
    ("out", 1): peer_a2a_bytes(sh, own)}``."""
    passes = PEER_A2A_PASSES[kind]
    return {(d, side): peer_a2a_bytes(sh, n, passes[d][side])
            for d, sides in (("in", (own, got)), ("out", (got, own))) for side, n in enumerate(sides)}


def te_a2a_bytes(sh: Shape, a2a: int, own: int, block: int) -> dict[str, float]:
    """A head-parallel ring member's all-to-all copies by :data:`~.engine_costs.A2A_PARTS` had TE's all-to-all made them
    (:data:`PEER_A2A_PASSES` ``te``: one pass each side): what ``charges="te"`` charges Zeppelin's head-parallel
    rings. ``own``: tokens the rank holds of the ring (all heads); ``block``: rows of its head buffer (its lane's
    heads). Example (Llama-7B bf16, ``a2a = 4``, ``own = 1000``, ``block = 4000``): each part
    ``2 * 2 * 16384 * 1000 = 2 * 2 * 4096 * 4000 = 65.5 MB``."""
    lane = lane_shape(sh, a2a)
    return {"heads pack": peer_a2a_bytes(sh, own), "heads unpack": peer_a2a_bytes(lane, block),
            "tokens pack": peer_a2a_bytes(lane, block), "tokens unpack": peer_a2a_bytes(sh, own)}
