"""The remap in, the engine and the remap out as one autograd Function (every plan that remaps).

*In-place chunks*: a local chunk whose sequences all *stay* (whole on the rank in the linear layout too,
:attr:`~zeppelin_megatron.planner.lowering_parts.LocalChunk.linear_rows`) runs on the rank's *linear* q/k/v
rows (views when :attr:`~zeppelin_megatron.planner.lowering_parts.LocalChunk.linear_span` is one range) and
writes out (backward: dq, dk, dv) straight into the linear result, allocated before the engine runs; the
exchanges gather their q/k/v rows in (backward reads them there) but neither their output rows out nor
their output-gradient rows in nor their dq/dk/dv rows out
(:func:`~zeppelin_megatron.planner.remap_staging.drop_rows`, ``post_parts(program=, into=)``), so those
attention rows are never read or written. *Remap windows* (``RankProgram.windows``, from the plan's
:class:`~zeppelin_megatron.planner.plan.RemapSlot` s) are in-place chunks run while an exchange is in flight.
Per layer, :class:`RemapWindows` runs::

    forward:  post(q, k, v -> attention)   window to_attention call(s)   wait
              engine forward (rings, slots, the call after the rings; in-place chunks into out)
              post(out -> linear)          window to_linear call(s)      wait (the other rows of out)
    backward: post(dout -> attention)      window to_attention calls' backward   wait
              engine backward (in-place chunks into dq, dk, dv)
              post(dq, dk, dv -> linear)   window to_linear calls' backward      wait

*Post* gathers the staying rows, packs the send buffer and starts the direct ``all_to_all`` with
``async_op=True`` (:func:`~.remap.post_parts`, :func:`~.comm.all_to_all_start`); *wait* finishes it under the
group's timeout (a failed peer raises :class:`~.errors.ZeppelinTimeoutError`, never hangs) and unpacks. A
routed remap (``plan.remap_proxies``) posts only its phase 1: phases 2 and 3 send rows that phase 1
delivered, so they run at the wait, one after the other (on every backend; no side stream).

Rows. An in-place call reads its linear rows as views when they are one ``[start, end)`` range
(``.contiguous()`` copies only when the caller's q/k/v are strided views, e.g. of a fused QKV tensor),
else with one ``index_select``. The remap in still gathers those rows into the attention buffers (one copy),
and backward reads q/k/v there (and dout at the linear rows), so the Function never keeps the caller's
linear q, k, v until backward: the activation memory of the path without in-place chunks (keeping them
would add the size of q, k and v per layer). The output, the output gradient and dq/dk/dv of those rows
skip the remap.

Example (2 ranks): sequence 3 (5 tokens) is local on rank 0 and its linear rows are ``[4, 9)`` of
rank 0's buffer; ``RemapSlot(0, "to_attention", (3,))`` makes rank 0 run one causal call on
``q[4:9], k[4:9], v[4:9]`` between posting and waiting for the remap in, writing ``out[4:9]`` of the
linear output, which the remap out leaves alone. Without the slot, the same call runs in the engine (after
the rings), on the same rows.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ..planner.lowering import RankProgram
from ..planner.plan import StepPlan
from .engine import AttentionEngine
from .kernels import VarlenBatch
from .remap import post_parts

__all__ = ["WindowIndex", "window_index", "RemapWindows", "OverlapFunction", "overlap_attention"]


@dataclass(frozen=True, kw_only=True)
class WindowIndex:
    """One window call on a device: ``direction``, ``chunk`` (index into ``local_chunks``), its linear
    ``rows`` [n] (sequence after sequence), ``span`` ``(start, end)`` when they are ``range(start, end)``
    (slices, no gather) else None, and the varlen ``batch`` (causal, the chunk's lengths)."""

    direction: str
    chunk: int
    rows: torch.Tensor
    span: tuple[int, int] | None
    batch: VarlenBatch


_WINDOWS: "weakref.WeakKeyDictionary[StepPlan, dict[Any, tuple[WindowIndex, ...]]]" = weakref.WeakKeyDictionary()


def window_index(plan: StepPlan, program: RankProgram, device: torch.device) -> tuple[WindowIndex, ...]:
    """``program.windows`` with their index tensors on ``device``, in program order (``to_attention``'s
    first), built once per plan, rank and device. Raises ``ValueError`` when a window's linear rows do
    not match its chunk's lengths or leave the rank's linear buffer (a plan the lowering did not make).

    Example: ``WindowCall(chunk=2, direction="to_linear", linear_rows=((5, 9), (0, 3)))`` over sequences
    of 4 and 3 tokens -> rows ``[5, 6, 7, 8, 0, 1, 2]``, span None, batch lengths ``(4, 3)``.
    """
    per_plan = _WINDOWS.setdefault(plan, {})
    key = (program.rank, program.windows, str(device))
    hit = per_plan.get(key)
    if hit is not None:
        return hit
    t_lin = plan.tokens(program.rank, "linear")
    out = []
    for w in program.windows:
        chunk = program.local_chunks[w.chunk]
        got = tuple(b - a for a, b in w.linear_rows)
        if got != chunk.lens or any(a < 0 or b > t_lin for a, b in w.linear_rows):
            raise ValueError(f"rank {program.rank}: window {w.direction} over sequences {list(chunk.seqs)} has "
                             f"linear rows {list(w.linear_rows)} ({list(got)} tokens), expected lengths "
                             f"{list(chunk.lens)} inside the rank's {t_lin} linear rows")
        ranges = w.linear_rows
        span = ((ranges[0][0], ranges[-1][1]) if all(b0 == a1 for (_, b0), (a1, _) in zip(ranges, ranges[1:]))
                else None)
        rows = torch.tensor([r for a, b in ranges for r in range(a, b)], dtype=torch.long, device=device)
        out.append(WindowIndex(direction=w.direction, chunk=w.chunk, rows=rows, span=span,
                               batch=VarlenBatch(lens_q=chunk.lens, lens_k=chunk.lens, causal=True, device=device)))
    hit = per_plan[key] = tuple(out)
    return hit


def _rows(x: torch.Tensor, rows: torch.Tensor, span: tuple[int, int] | None) -> torch.Tensor:
    """``x``'s ``rows``, contiguous: a view when they are ``range(*span)`` of a contiguous ``x``, else a
    gather (or a copy of a strided slice)."""
    return x.index_select(0, rows) if span is None else x[span[0]:span[1]].contiguous()


def _write(dst: torch.Tensor, w: WindowIndex, src: torch.Tensor) -> None:
    """Overwrite ``dst``'s window rows with ``src`` (cast to ``dst``'s dtype)."""
    if w.span is None:
        dst.index_copy_(0, w.rows, src.to(dst.dtype))
    else:
        dst[w.span[0]:w.span[1]].copy_(src)


def _empty(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


class RemapWindows:
    """The remap in, the engine and the remap out of one rank, with its in-place chunks on the linear rows and
    its window calls inside the exchanges (module docstring). ``engine``: the rank's
    :class:`~.engine.AttentionEngine` (the plan remaps)."""

    def __init__(self, engine: AttentionEngine) -> None:
        self.engine = engine
        self.plan, self.group, self.kernel, self.scale = engine.plan, engine.group, engine.kernel, engine.scale
        self.windows = window_index(engine.plan, engine.program, engine.device)
        self.in_place = bool(engine.dev.linear_local)  # the rank has in-place chunks (windows among them)
        self.program = engine.program if self.in_place else None

    def _calls(self, direction: str) -> list[WindowIndex]:
        return [w for w in self.windows if w.direction == direction]

    def _forward_calls(self, direction: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       saved: dict[int, tuple[torch.Tensor, torch.Tensor]], out: torch.Tensor | None) -> None:
        for w in self._calls(direction):
            assert out is not None
            qw, kw, vw = (_rows(x, w.rows, w.span) for x in (q, k, v))
            saved[w.chunk] = self.kernel.forward(qw, kw, vw, w.batch, self.scale)  # (out, lse)
            _write(out, w, saved[w.chunk][0])  # rows the remap out leaves alone

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """``q`` [T_l, Hq, D], ``k``, ``v`` [T_l, Hkv, D] in the linear layout -> ``(out [T_l, Hq, D], saved)``."""
        plan, group, prog = self.plan, self.group, self.program
        wins: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        out = _empty(q) if self.in_place else None  # in-place calls and windows write their rows here first
        # q, k, v in: every attention row, in-place chunks' too (their backward reads them there, so the caller's
        # linear q, k, v are not kept until backward); out, dout and dq/dk/dv skip those rows.
        posted = post_parts([q, k, v], plan, group, "to_attention")
        self._forward_calls("to_attention", q, k, v, wins, out)
        q_a, k_a, v_a = posted.wait()
        out_a, eng = self.engine.forward(q_a, k_a, v_a, linear=None if out is None else (q, k, v, out))
        posted = post_parts([out_a], plan, group, "to_linear", program=prog, into=None if out is None else [out])
        self._forward_calls("to_linear", q, k, v, wins, out)
        (out,) = posted.wait()
        like = tuple((x.shape, x.dtype, x.device) for x in (q, k, v)) if self.in_place else None
        return out, {"qkv": (q_a, k_a, v_a), "engine": eng, "windows": wins, "like": like}

    def _backward_calls(self, direction: str, dout: torch.Tensor, saved: dict[str, Any],
                        grads: tuple[torch.Tensor, ...] | None) -> None:
        for w in self._calls(direction):
            assert grads is not None
            o, lse = saved["windows"][w.chunk]
            att_rows, att_span = self.engine.dev.local[w.chunk][0], self.engine.dev.local_spans[w.chunk]
            qw, kw, vw = (_rows(x, att_rows, att_span) for x in saved["qkv"])  # the attention buffers' rows
            parts = self.kernel.backward(_rows(dout, w.rows, w.span), qw, kw, vw, o, lse, w.batch, self.scale)
            for acc, part in zip(grads, parts):
                _write(acc, w, part)

    def backward(self, dout: torch.Tensor, saved: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``dout`` [T_l, Hq, D] (linear, contiguous) -> ``(dq, dk, dv)`` in the linear layout."""
        plan, group, prog = self.plan, self.group, self.program
        like = saved["like"]
        grads = tuple(torch.empty(shape, dtype=dt, device=dv) for shape, dt, dv in like) if like is not None else None
        posted = post_parts([dout], plan, group, "to_attention", program=prog)
        self._backward_calls("to_attention", dout, saved, grads)
        (dout_a,) = posted.wait()
        q_a, k_a, v_a = saved["qkv"]
        dq_a, dk_a, dv_a = self.engine.backward(dout_a, q_a, k_a, v_a, saved["engine"],
                                                linear=None if grads is None else (dout, *grads))
        posted = post_parts([dq_a, dk_a, dv_a], plan, group, "to_linear", program=prog,
                            into=None if grads is None else list(grads))
        self._backward_calls("to_linear", dout, saved, grads)
        dq, dk, dv = posted.wait()
        return dq, dk, dv


class OverlapFunction(torch.autograd.Function):
    """Autograd wrapper of :class:`RemapWindows`: ``(q, k, v)`` linear -> ``out`` linear, one Function for
    the remap in, the engine and the remap out (the windows sit inside the exchanges, both directions)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, run: RemapWindows) -> torch.Tensor:
        out, saved = run.forward(q, k, v)
        ctx.run, ctx.saved = run, saved
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.saved is None:
            raise RuntimeError("zeppelin_attention with remap windows: backward ran twice on one call "
                               "(its saved tensors are freed after the first)")
        dq, dk, dv = ctx.run.backward(dout.contiguous(), ctx.saved)
        ctx.saved = None
        return dq, dk, dv, None


def overlap_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, engine: AttentionEngine) -> torch.Tensor:
    """``q`` [T_l, Hq, D], ``k``, ``v`` [T_l, Hkv, D] (linear layout) -> ``out`` [T_l, Hq, D], differentiable:
    the remap in, ``engine`` and the remap out with the rank's remap windows (:class:`RemapWindows`)."""
    out: torch.Tensor = OverlapFunction.apply(q, k, v, RemapWindows(engine))
    return out
