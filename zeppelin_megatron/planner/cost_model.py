"""Calibrated cost model: attention, linear and communication times per layer.

All times are milliseconds for one transformer layer, forward + backward.

Attention. The profile times varlen calls of ``n`` sequences of length ``s``;
from each row we derive the achieved rate ``R(s) = flops(s) / time``, with
forward+backward flops of causal attention over ``H`` query heads of dim ``D``::

    flops_causal(s) = 3.5 * 4 * s * s * H * D / 2     (non-causal: twice that)

(forward ``4 s^2 H D``, backward 2.5x forward, causal halves the work). For
another length we interpolate ``R`` linearly in ``log2(s)`` between the
measured points; above the last point ``R`` stays at the last value; below
the first it falls in proportion to ``s`` (the kernel is tile-bound, so a
sequence shorter than the first point costs ``time(s_min) * s / s_min``). The
time for the model is ``flops_model(s) / R(s)``: rates transfer across head
counts, flops do not. Rectangular ring blocks ``q x k`` use the
``ring_blocks`` rows interpolated in ``log2(q * k)``.

Linear. ``ms_per_token(t)`` interpolated in ``log2(t)`` from the linear rows,
scaled by the ratio of the model's linear weights per layer to the
profiled layer's, divided by the tensor-parallel size.

Communication. ``bytes / bandwidth + latency``; K/V bytes per token are
``2 * kv_heads/tp * head_dim * dtype_bytes``. A ring step moves a rank's K/V
chunk pair forward, and in backward K/V again plus the dK/dV accumulators:
``3x`` the forward K/V bytes per step.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .cluster import Cluster
from .model import ModelShape, linear_params
from .profile import CostProfile, default_profile
from .zigzag import ring_chunk_pair_tokens, ring_source, zigzag_ranges

__all__ = ["CostModel", "LogInterp"]

_FWD_BWD = 3.5  # backward is 2.5x forward


class LogInterp:
    """Piecewise-linear interpolation of ``y`` over ``log2(x)``.

    Below the first point ``y`` is scaled by ``x / x0`` (``below="linear"``) or
    held (``below="hold"``); above the last point it is held.
    """

    def __init__(self, xs: list[float], ys: list[float], *, below: str = "hold") -> None:
        if not xs or len(xs) != len(ys):
            raise ValueError("LogInterp needs matching, non-empty xs and ys")
        pairs = sorted(zip(xs, ys))
        self._lx = [math.log2(x) for x, _ in pairs]
        self._x0 = pairs[0][0]
        self._ys = [y for _, y in pairs]
        self._below = below

    def __call__(self, x: float) -> float:
        lx = math.log2(x)
        if lx <= self._lx[0]:
            y0 = self._ys[0]
            return y0 * (x / self._x0) if self._below == "linear" else y0
        if lx >= self._lx[-1]:
            return self._ys[-1]
        j = bisect_left(self._lx, lx)
        x0, x1 = self._lx[j - 1], self._lx[j]
        y0, y1 = self._ys[j - 1], self._ys[j]
        return y0 + (y1 - y0) * (lx - x0) / (x1 - x0)

    def segments(self) -> list[tuple[float, float]]:
        """Per segment between two points, ``(min(y0, y1), x * dy/dx)``: the least ``y`` on it and ``y``'s
        slope per unit of ``ln x`` (constant on a segment: ``(y1 - y0) / ((log2 x1 - log2 x0) ln 2)``). Example:
        points ``(1, 4)`` and ``(2, 2)``: ``[(2, -2 / ln 2)]``."""
        return [(min(y0, y1), (y1 - y0) / ((x1 - x0) * math.log(2)))
                for x0, x1, y0, y1 in zip(self._lx, self._lx[1:], self._ys, self._ys[1:])]

    @property
    def ys(self) -> tuple[float, ...]:
        """The points' ``y`` in ``x`` order."""
        return tuple(self._ys)


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Per-layer times for ``model`` on ``cluster`` from a measured ``profile``."""

    model: ModelShape
    cluster: Cluster
    profile: CostProfile = field(default_factory=default_profile)
    tensor_parallel: int = 1
    if TYPE_CHECKING:  # set in __post_init__ (not dataclass fields: no init, repr or comparison)
        _rate_causal: LogInterp = field(init=False)
        _rate_block: LogInterp = field(init=False)
        _lin_ms_per_token: LogInterp = field(init=False)
        _cache: dict[tuple, Any] = field(init=False)
        _links: tuple[tuple[float, float], tuple[float, float]] = field(init=False)  # NVLink, NIC: see nvlink_ms
        _causal: dict[int, float] = field(init=False)  # causal_ms by length
        _linear: dict[int, float] = field(init=False)  # linear_ms by tokens

    def __post_init__(self) -> None:
        for name, kind, hint in (("model", ModelShape, "load_model('configs/models/llama_7b.yaml')"),
                                 ("cluster", Cluster, "load_cluster('4x8')"),
                                 ("profile", CostProfile, "load_profile(path) or leave it out")):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(f"CostModel {name} is the {type(value).__name__} {value!r:.60}, expected a "
                                f"{kind.__name__} (e.g. {hint})")
        tp = self.tensor_parallel
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel must be a positive integer, got {tp!r}")
        if self.model.kv_heads % tp:
            raise ValueError(
                f"kv_heads = {self.model.kv_heads} is not divisible by tensor_parallel = {tp}"
            )
        p = self.profile
        causal = [r for r in p.attention if r.causal]
        full = [r for r in p.attention if not r.causal]
        rate_c = [self._flops(r.seqlen, r.seqlen, True, p.attn_q_heads, p.attn_head_dim) * r.num_seqs
                  / r.fwd_bwd_ms for r in causal]
        object.__setattr__(self, "_rate_causal",
                           LogInterp([r.seqlen for r in causal], rate_c, below="linear"))
        if p.blocks:
            xs = [r.q_len * r.k_len for r in p.blocks]
            ys = [self._flops(r.q_len, r.k_len, False, p.block_q_heads, p.block_head_dim) * r.num_seqs
                  / r.fwd_bwd_ms for r in p.blocks]
        elif full:
            xs = [r.seqlen * r.seqlen for r in full]
            ys = [self._flops(r.seqlen, r.seqlen, False, p.attn_q_heads, p.attn_head_dim) * r.num_seqs
                  / r.fwd_bwd_ms for r in full]
        else:  # only causal rows: a causal s x s call does s*s/2 area
            xs = [r.seqlen * r.seqlen / 2 for r in causal]  # type: ignore[misc]  # areas: ints elsewhere
            ys = rate_c
        # Several rows may share an area (q x k and k x q): average them.
        by_area: dict[float, list[float]] = {}
        for x, y in zip(xs, ys):
            by_area.setdefault(x, []).append(y)
        areas = sorted(by_area)
        object.__setattr__(self, "_rate_block", LogInterp(
            areas, [sum(by_area[a]) / len(by_area[a]) for a in areas], below="linear"))
        lin_params = linear_params(p.lin_hidden, p.lin_ffn, p.lin_q_heads, p.lin_kv_heads, p.lin_head_dim)
        scale = self.model.linear_params_per_layer() / lin_params / tp
        object.__setattr__(self, "_lin_ms_per_token", LogInterp(
            [r.tokens for r in p.linear], [r.fwd_bwd_ms / r.tokens * scale for r in p.linear]))
        object.__setattr__(self, "_cache", {})
        c = self.cluster
        object.__setattr__(self, "_links", (((p.nvlink_GBps or c.nvlink_GBps) * 1e6, c.nvlink_latency_us * 1e-3),
                                            ((p.nic_GBps or c.nic_GBps) * 1e6, c.nic_latency_us * 1e-3)))
        object.__setattr__(self, "_causal", {})
        object.__setattr__(self, "_linear", {})

    # -- flops -------------------------------------------------------------
    @staticmethod
    def _flops(q_len: int, k_len: int, causal: bool, heads: int, head_dim: int) -> float:
        area = q_len * k_len / 2 if causal else q_len * k_len
        return _FWD_BWD * 4.0 * area * heads * head_dim

    @property
    def heads(self) -> int:
        """Query heads on one rank (after tensor parallelism)."""
        return self.model.q_heads // self.tensor_parallel

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V bytes of one token on one rank."""
        return 2 * (self.model.kv_heads // self.tensor_parallel) * self.model.head_dim * self.profile.dtype_bytes

    @property
    def q_bytes_per_token(self) -> int:
        return self.heads * self.model.head_dim * self.profile.dtype_bytes

    @property
    def call_overhead_ms(self) -> float:
        return self.profile.call_overhead_ms

    # -- attention ---------------------------------------------------------
    def causal_ms(self, s: int) -> float:
        """Kernel time of one whole causal sequence of ``s`` tokens (no call overhead)."""
        hit = self._causal.get(s)
        if hit is None:  # memoised: the partitioner and the layout choice ask for every sequence many times
            hit = 0.0 if s <= 0 else self._flops(s, s, True, self.heads, self.model.head_dim) / self._rate_causal(s)
            self._causal[s] = hit
        return hit

    def block_ms(self, q_len: int, k_len: int) -> float:
        """Kernel time of one non-causal ``q_len x k_len`` block."""
        if q_len <= 0 or k_len <= 0:
            return 0.0
        return self._flops(q_len, k_len, False, self.heads, self.model.head_dim) / self._rate_block(q_len * k_len)

    def local_ms(self, s: int) -> float:
        """Per-layer time of sequence ``s`` kept whole on one GPU (in a batched call): :meth:`causal_ms`."""
        hit = self._causal.get(s)
        return self.causal_ms(s) if hit is None else hit

    def ring_step_compute_ms(self, s: int, ring: int, position: int, step: int) -> float:
        """Kernel time of ring ``position``'s block at ``step`` for one sequence.

        Step 0 is the causal diagonal over the rank's two chunks; at step
        ``j >= 1`` the rank sees the chunks of position ``src = (i - j) mod g``:
        if ``src < i`` both of its chunks attend to chunk ``src`` (``2c x c``),
        else its late chunk attends to both of ``src``'s chunks (``c x 2c``).
        """
        (a0, a1), (b0, b1) = zigzag_ranges(s, ring, position)
        mine = (a1 - a0, b1 - b0)
        if step == 0:
            # Diagonal: equivalent to a causal sequence of both chunks.
            return self.causal_ms(mine[0] + mine[1])
        src = ring_source(position, step, ring)
        (c0, c1), (d0, d1) = zigzag_ranges(s, ring, src)
        theirs = (c1 - c0, d1 - d0)
        if src < position:
            return self.block_ms(mine[0] + mine[1], theirs[0])
        return self.block_ms(mine[1], theirs[0] + theirs[1])

    def ring_compute_profile(self, s: int, ring: int) -> tuple[float, float]:
        """``(diagonal step, max off-diagonal step)`` kernel times, cached."""
        key = ("rcp", s, ring)
        hit = self._cache.get(key)
        if hit is None:
            c = s / (2 * ring)
            diag = self.causal_ms(int(round(2 * c)))
            off = self.block_ms(int(math.ceil(2 * c)), int(math.ceil(c)))
            hit = (diag, off)
            self._cache[key] = hit
        return hit

    def ring_step_bytes(self, s: int, ring: int) -> int:
        """K/V payload (forward) one rank sends in one ring step: two chunks of the largest chunk size
        (:func:`~.zigzag.ring_chunk_pair_tokens`, at most one token above the exact largest position)."""
        return ring_chunk_pair_tokens(s, ring) * self.kv_bytes_per_token

    def link_ms(self, nbytes: float, GBps: float, latency_us: float) -> float:
        """``latency + bytes / bandwidth`` of one transfer over a link (0 for no bytes): the definition
        :meth:`nvlink_ms` and :meth:`nic_ms` apply with their links' terms computed once (``_links``)."""
        if nbytes <= 0:
            return 0.0
        return nbytes / (GBps * 1e6) + latency_us * 1e-3

    def nvlink_ms(self, nbytes: float) -> float:
        """:meth:`link_ms` over NVLink (the profile's bandwidth, else the cluster's; the cluster's latency)."""
        if nbytes <= 0:
            return 0.0
        per_ms, lat_ms = self._links[0]  # GBps * 1e6 and latency_us * 1e-3: link_ms's terms, computed once
        return nbytes / per_ms + lat_ms

    def nic_ms(self, nbytes: float, nics: int = 1) -> float:
        """Bytes over ``nics`` NICs in parallel (bytes split evenly)."""
        nbytes = nbytes / nics
        if nbytes <= 0:
            return 0.0
        per_ms, lat_ms = self._links[1]
        return nbytes / per_ms + lat_ms

    def routed_ms(self, nbytes: float, proxies: int) -> float:
        """An inter-node transfer spread over ``proxies`` rail-aligned NICs.

        Store-and-forward (conservative): dispatch ``(p-1)/p`` of the bytes over
        NVLink, ``1/p`` per NIC in parallel, combine ``(p-1)/p`` over NVLink.
        """
        if proxies <= 1:
            return self.nic_ms(nbytes)
        moved = nbytes * (proxies - 1) / proxies
        return 2 * self.nvlink_ms(moved) + self.nic_ms(nbytes, proxies)

    def ring_step_comm_ms(self, s: int, ring: int, *, inter_node: bool, proxies: int = 1) -> float:
        """Forward+backward transfer time of one ring step (3x the K/V bytes)."""
        nbytes = 3 * self.ring_step_bytes(s, ring)
        if not inter_node:
            return self.nvlink_ms(nbytes)
        return self.routed_ms(nbytes, proxies)

    def ring_ms(self, s: int, ring: int, *, inter_node: bool, proxies: int = 1) -> float:
        """Per-rank time of sequence ``s`` alone on a ring, comm overlapped with compute.

        ``diag + (g-1) * max(off, comm)``, each kernel call at least the call overhead.
        """
        key = ("ring", s, ring, inter_node, proxies)
        hit = self._cache.get(key)
        if hit is None:
            diag, off = self.ring_compute_profile(s, ring)
            o = self.call_overhead_ms
            comm = self.ring_step_comm_ms(s, ring, inter_node=inter_node, proxies=proxies)
            hit = max(diag, o) + (ring - 1) * max(off, o, comm)
            self._cache[key] = hit
        return hit

    def ring_may_beat_local(self, s: int, ring: int) -> bool:
        """``False`` when no ring of ``ring`` GPUs can take sequence ``s`` faster than one GPU: each of its
        ``ring`` kernel calls pays at least the call overhead (:meth:`ring_ms` is at least ``ring * o``), so
        ``local_ms(s) <= ring * o`` rules it out before any ring is priced; ``True`` says nothing. Example
        (Llama-7B on H100, ``o`` about 1.09 ms): a 4096-token document, about 1.8 ms whole, never pays on a
        ring."""
        return self.local_ms(s) > ring * self.call_overhead_ms

    def comm_ratio(self, s: int, ring: int, *, inter_node: bool, proxies: int = 1) -> float:
        """Compute-to-communication ratio of one off-diagonal ring step."""
        _, off = self.ring_compute_profile(s, ring)
        comm = self.ring_step_comm_ms(s, ring, inter_node=inter_node, proxies=proxies)
        return off / comm if comm > 0 else math.inf

    # -- linear --------------------------------------------------------------
    def linear_ms(self, tokens: int) -> float:
        """Per-layer QKV + output projection + MLP time for ``tokens`` tokens on one rank."""
        hit = self._linear.get(tokens)
        if hit is None:  # memoised: every prediction asks for every rank's tokens
            hit = self._linear[tokens] = 0.0 if tokens <= 0 else tokens * self._lin_ms_per_token(tokens)
        return hit

    def times_increase(self) -> bool:
        """Whether :meth:`local_ms` never falls and :meth:`linear_ms` strictly rises with the tokens, for every
        token count: what :func:`~.whole_moves.trade_whole` needs to find its swaps by bisection. Memoised.

        Checked on the profile's rows (sufficient conditions, every rate positive): ``local_ms(s) = K s^2 / c(s)``
        with ``c`` the causal rate, interpolated over ``log2 s`` (``K s x0 / c0`` below the first row, ``K s^2 / c``
        above the last), so on a segment ``d local_ms / ds = K s (2 c(s) - s c'(s)) / c(s)^2``, at least 0 where
        ``2 min(c0, c1) >= s c'(s)``; ``linear_ms(t) = t m(t)`` with ``m`` the ms per token (held beyond the
        rows), so ``d linear_ms / dt = m(t) + t m'(t)``, above 0 where ``min(m0, m1) + t m'(t) > 0``
        (:meth:`LogInterp.segments`: ``s c'(s)`` and ``t m'(t)`` are constant on a segment). The bundled H100
        profile passes; a profile whose causal rate grows more than ``1 + 2 ln 2`` (about 2.4) times from one row to
        one of twice the length fails, and the trades then try every swap."""
        key = ("times_increase",)
        hit = self._cache.get(key)
        if hit is None:
            causal, per_token = self._rate_causal, self._lin_ms_per_token
            hit = self._cache[key] = (min(causal.ys + per_token.ys) > 0
                                      and all(2 * low >= slope for low, slope in causal.segments())
                                      and all(low + slope > 0 for low, slope in per_token.segments()))
        return hit  # type: ignore[no-any-return]

    def least_linear_ms_per_token(self) -> float:
        """The least ``linear_ms(t) / t`` over all ``t``: at one of the profile's linear rows (the rate is
        interpolated between them over ``log2(t)`` and held beyond), so ``tokens *`` this bounds
        :meth:`linear_ms` from below; the floors of the packed search use it. Memoised."""
        hit = self._cache.get(("least_linear_ms_per_token",))
        if hit is None:
            hit = self._cache[("least_linear_ms_per_token",)] = min(self.linear_ms(r.tokens) / r.tokens
                                                                 for r in self.profile.linear)
        return hit  # type: ignore[no-any-return]

    # -- ring blocks by orientation (simulator) -------------------------------------------------
    def block_fitted_ms(self, q_len: int, k_len: int) -> float:
        """Kernel time of one non-causal ``q_len x k_len`` block, fitted to the measured block of its
        orientation: tall (``q > k``, a zigzag ``early`` call) and wide (``q < k``, a ``late`` call)
        rows are interpolated separately in ``log2(q * k)``; :meth:`block_ms` averages the two, which
        is up to 10% off each at small blocks (128 x 64: 5.20 ms measured, 4.67 ms averaged, 512
        blocks). Square blocks, or a profile without rows of that orientation, fall back to
        :meth:`block_ms`. Used by the simulator to time each lowered ring call by its shape.
        """
        if q_len <= 0 or k_len <= 0:
            return 0.0
        fits = self._cache.get(("block_fit",))
        if fits is None:
            p = self.profile
            fits = {}
            for name, keep in (("tall", lambda r: r.q_len > r.k_len), ("wide", lambda r: r.q_len < r.k_len)):
                rows = [r for r in p.blocks if keep(r)]
                if rows:
                    by_area: dict[float, list[float]] = {}
                    for r in rows:
                        rate = self._flops(r.q_len, r.k_len, False, p.block_q_heads, p.block_head_dim) * r.num_seqs
                        by_area.setdefault(r.q_len * r.k_len, []).append(rate / r.fwd_bwd_ms)
                    areas = sorted(by_area)
                    fits[name] = LogInterp(areas, [sum(by_area[a]) / len(by_area[a]) for a in areas], below="linear")
            self._cache[("block_fit",)] = fits
        fit = fits.get("tall" if q_len > k_len else "wide") if q_len != k_len else None
        if fit is None:
            return self.block_ms(q_len, k_len)
        return self._flops(q_len, k_len, False, self.heads, self.model.head_dim) / fit(q_len * k_len)
