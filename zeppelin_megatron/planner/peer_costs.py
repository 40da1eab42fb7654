"""Device-memory work of the peers' attention engines, in bytes: what the simulator charges the baselines.

The twin of :mod:`.engine_costs` (Zeppelin's engine, counted from this project's runtime) for the engines the
baselines run, each read from its own code; same notation (``b``, ``a``, ``Eq``, ``Ekv``, ``Hq``) and the same
``bytes / hbm_GBps`` charge (:func:`~.engine_costs.hbm_ms`). The simulator re-exports these
(:mod:`zeppelin_megatron.sim.charges`) and charges them op by op; the planner prices them under
``charges="te"`` (:mod:`.engine_ring`, :mod:`.cost_heads`). Pure: the planner's own modules only.

**Transformer Engine CP's ring** (``te-cp``, ``te-cp-routing``, ``wlb-llm``, ``hybrid-dp``,
``megatron-hcp``, the ring of ``te-cp-a2a-p2p``; :func:`te_step_bytes`): our reading of TE's
``AttnFuncWithCPAndKVP2P``: the softmax-lse and output corrections are fused (``jit_fuser``) kernels,
one pass each per step: r ``b`` (the step's bf16 output) + r/w ``a`` (the running output) per ``T Eq``,
``5a T Hq``; backward accumulates dQ and dK/dV in the training dtype (``3b`` per element); the forward
packs K and V into its first send buffer once per ring (``torch.cat``, :func:`te_kv_buffer_bytes`: ``2 b n
Ekv``). No other row gathers (TE's THD buffers are used in place). This is a lower bound for TE: it favours
the baseline.

**The peers' Ulysses all-to-alls** (``flexsp``; the all-to-all of ``te-cp-a2a-p2p``; Zeppelin's head-parallel
rings under ``charges="te"``): the full read + write passes their code makes around each all-to-all,
:data:`PEER_A2A_PASSES` (TE: one pass on each side; FlexSP: one, on the side whose permute moves data),
:func:`peer_a2a_bytes` per pass, :func:`te_a2a_bytes` by :data:`~.engine_costs.A2A_PARTS`.

Not charged (favouring those baselines): TE's BSHD chunk reorder (a second pass; Megatron's packed sequences are
THD), the copies of TE's all-gather CP (``allgather-cp``).
"""

from __future__ import annotations

from .engine_costs import Shape, lane_shape

__all__ = ["te_step_bytes", "te_kv_buffer_bytes", "PEER_A2A_PASSES", "peer_a2a_bytes", "te_a2a_bytes"]


def te_step_bytes(sh: Shape, q_rows: float, kv_rows: float) -> float:
    """TE CP ring: forward correction + backward dQ, dK/dV accumulation of one step (not the diagonal)."""
    a, b = sh.a, sh.b
    return float(q_rows * sh.eq * (b + 2 * a) + 5 * a * q_rows * sh.hq
                 + 3 * b * q_rows * sh.eq + 3 * b * kv_rows * sh.ekv)


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


def te_kv_buffer_bytes(sh: Shape, rows: float) -> float:
    """TE CP's ring packs K and V into its first send buffer (``torch.cat`` in ``AttnFuncWithCPAndKVP2P.forward``)
    once per ring: ``2 b Ekv rows`` (what Zeppelin's engine pays for its packed K/V buffer,
    :func:`~.engine_costs.zeppelin_ring_bytes`)."""
    return 2.0 * sh.b * sh.ekv * rows


def te_a2a_bytes(sh: Shape, a2a: int, own: int, block: int) -> dict[str, float]:
    """A head-parallel ring member's all-to-all copies by :data:`~.engine_costs.A2A_PARTS` had TE's all-to-all made them
    (:data:`PEER_A2A_PASSES` ``te``: one pass each side): what ``charges="te"`` charges Zeppelin's head-parallel
    rings. ``own``: tokens the rank holds of the ring (all heads); ``block``: rows of its head buffer (its lane's
    heads). Example (Llama-7B bf16, ``a2a = 4``, ``own = 1000``, ``block = 4000``): each part
    ``2 * 2 * 16384 * 1000 = 2 * 2 * 4096 * 4000 = 65.5 MB``."""
    lane = lane_shape(sh, a2a)
    return {"heads pack": peer_a2a_bytes(sh, own), "heads unpack": peer_a2a_bytes(lane, block),
            "tokens pack": peer_a2a_bytes(lane, block), "tokens unpack": peer_a2a_bytes(sh, own)}
