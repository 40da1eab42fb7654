"""The remap in, the engine and the remap out as one autograd Function (every plan that remaps).

*In-place chunks*: a local chunk whose sequences all *stay* (whole on the rank in the linear layout too,
:attr:`~zeppelin_megatron.planner.lowering_parts.LocalChunk.linear_rows`) runs on the rank's *linear* q/k/v
rows (views when :attr:`~zeppelin_megatron.planner.lowering_parts.LocalChunk.linear_span` is one range) and
writes out (backward: dq, dk, dv) straight into the linear result, allocated before the engine runs; the
exchanges gather their q/k/v rows in (backward reads them there) but neither their output rows out nor
their output-gradient rows in nor their dq/dk/dv rows out
(:func:`~zeppelin_megatron.planner.remap_staging.drop_rows`, ``post_parts(program=, into=)``). The call
itself is the engine's (:meth:`~.engine.AttentionEngine.local_forward` / ``local_backward``), here and for
the windows. *Remap windows* (``RankProgram.windows``, from the plan's
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

from typing import Any

import torch

from .engine import AttentionEngine
from .remap import post_parts

__all__ = ["RemapWindows", "OverlapFunction", "overlap_attention"]


def _empty(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


class RemapWindows:
    """The remap in, the engine and the remap out of one rank, with its in-place chunks on the linear rows and
    its window calls inside the exchanges (module docstring). ``engine``: the rank's
    :class:`~.engine.AttentionEngine` (the plan remaps)."""

    def __init__(self, engine: AttentionEngine) -> None:
        self.engine = engine
        self.plan, self.group, self.kernel, self.scale = engine.plan, engine.group, engine.kernel, engine.scale
        self.in_place = bool(engine.dev.linear_local)  # the rank has in-place chunks (windows among them)
        self.program = engine.program if self.in_place else None
        if any(w.chunk not in engine.dev.linear_local for w in engine.program.windows):
            raise ValueError(f"rank {engine.program.rank}: a remap window's chunk has no linear rows (a plan the "
                             f"lowering did not make)")

    def _calls(self, direction: str) -> list[int]:
        """The local chunks of ``direction``'s window calls, in program order."""
        return [w.chunk for w in self.engine.program.windows if w.direction == direction]

    def _forward_calls(self, direction: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       saved: dict[int, tuple[torch.Tensor, torch.Tensor]], out: torch.Tensor | None) -> None:
        for chunk in self._calls(direction):  # on the linear rows (views when one range), into out's rows
            assert out is not None
            saved[chunk] = self.engine.local_forward(chunk, None, None, linear=(q, k, v, out))  # (out, lse)

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
        for chunk in self._calls(direction):  # dout and grads at the linear rows, q/k/v at the attention rows
            assert grads is not None
            self.engine.local_backward(chunk, saved["windows"][chunk], None, saved["qkv"], None,
                                       linear=(dout, *grads))

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
