"""Which training step a micro-step belongs to, Megatron's batch-size ramp-up included.

Megatron runs ``global_batch / (micro_batch_size * N)`` micro-steps per training step (``N``: data-parallel ranks,
Zeppelin's ranks). With ``--rampup-batch-size START INCREMENT SAMPLES`` the global batch grows as
megatron-core's ``RampupBatchsizeNumMicroBatchesCalculator`` grows it: before a step begun with ``consumed``
samples consumed, ::

    batch = GBS                                           if consumed > SAMPLES
          = START + int(consumed / per_increment) * INCREMENT   otherwise,
    per_increment = SAMPLES / ((GBS - START) / INCREMENT)  (a float, as megatron-core computes it)

and the step runs ``batch`` samples, or with ``--decrease-batch-size-if-needed`` ``batch`` rounded down to a
multiple of ``micro_batch_size * N``; ``consumed`` grows by what ran. Every micro-step consumes
``micro_batch_size * N`` samples whatever the batch, so the data side needs nothing of this (resume:
:func:`~.data.iterator.from_consumed_samples`); the step metrics group micro-steps into steps with it.

Worked example: ``mbs * N = 4``, ``--rampup-batch-size 4 4 20``, GBS 12: per_increment = 20 / 2 = 10. Step 0
(consumed 0): batch 4, 1 micro-step; step 1 (consumed 4): 4, 1; step 2 (8): 4, 1; step 3 (12): 8, 2; step 4 (20):
12, 3 (20 is not > 20, but int(20 / 10) = 2 increments is GBS already), and 3 from then on. Micro-steps:
0 | 1 | 2 | 3 4 | 5 6 7 | 8 9 10 | ...

The ramp is kept as segments of equal steps (at most one per increment, found by bisection on megatron-core's
own float expression), so locating a micro-step costs a search over them, not a walk over every step.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["RampupError", "StepSchedule"]


class RampupError(ValueError):
    """A ramp-up Megatron cannot run (or would fail on mid-run), named with its numbers."""


@dataclass(frozen=True)
class _Segment:
    first_step: int
    first_micro_step: int
    steps: int
    count: int  # micro-steps per step


@dataclass(frozen=True, kw_only=True)
class StepSchedule:
    """Micro-steps per training step (module docstring). ``samples_per_micro_step``: ``micro_batch_size * N``;
    ``rampup``: ``(START, INCREMENT, SAMPLES)`` of ``--rampup-batch-size`` or ``None``."""

    samples_per_micro_step: int
    global_batch_size: int
    rampup: tuple[int, int, int] | None = None
    decrease_if_needed: bool = False
    _segments: tuple[_Segment, ...] = field(init=False, repr=False, compare=False)
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spm, gbs = self.samples_per_micro_step, self.global_batch_size
        for name, value in (("samples per micro-step", spm), ("--global-batch-size", gbs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RampupError(f"{name} must be a positive integer, got {value!r}")
        if gbs % spm:
            raise RampupError(f"--global-batch-size {gbs} is not a multiple of {spm} samples per micro-step")
        segments = self._ramp() if self.rampup is not None else ()
        object.__setattr__(self, "_segments", segments)
        object.__setattr__(self, "_starts", tuple(s.first_micro_step for s in segments))

    @property
    def micro_steps_per_step(self) -> int:
        """After the ramp (and without one): ``global_batch_size / samples_per_micro_step``."""
        return self.global_batch_size // self.samples_per_micro_step

    def _check_rampup(self) -> tuple[int, int, int]:
        assert self.rampup is not None
        if len(self.rampup) != 3 or any(isinstance(v, bool) or not isinstance(v, int) for v in self.rampup):
            raise RampupError(f"--rampup-batch-size takes three integers START INCREMENT SAMPLES, got {self.rampup!r}")
        start, inc, samples = self.rampup
        spm, gbs = self.samples_per_micro_step, self.global_batch_size
        flag = f"--rampup-batch-size {start} {inc} {samples}"
        if start < 1 or inc < 1 or samples < 1:
            raise RampupError(f"{flag}: START, INCREMENT and SAMPLES must be positive (megatron-core divides by "
                              "SAMPLES and by the increments)")
        if not start < gbs or (gbs - start) % inc:
            raise RampupError(f"{flag}: --global-batch-size {gbs} must be START plus a positive multiple of "
                              f"INCREMENT (megatron-core's ramp divides by (GBS - START) / INCREMENT)")
        if self.decrease_if_needed:
            if start < spm:
                raise RampupError(f"{flag} with --decrease-batch-size-if-needed: START {start} is less than one "
                                  f"micro-step's {spm} samples (micro-batch size x data-parallel ranks): the "
                                  "first steps would run no micro-step")
        elif start % spm or inc % spm:
            raise RampupError(f"{flag}: START and INCREMENT must be multiples of the {spm} samples of a micro-step "
                              "(micro-batch size x data-parallel ranks), as Megatron checks at every step; or add "
                              "--decrease-batch-size-if-needed")
        return start, inc, samples

    def _ramp(self) -> tuple[_Segment, ...]:
        """The steps begun with ``consumed <= SAMPLES``, as segments of equal batch."""
        start, inc, samples = self._check_rampup()
        spm = self.samples_per_micro_step
        per_increment = samples / ((self.global_batch_size - start) // inc)  # megatron-core's float

        def level(consumed: int) -> int:
            return int(consumed / per_increment)

        segments: list[_Segment] = []
        consumed = step = micro = 0
        while consumed <= samples:
            k = level(consumed)
            run = (start + k * inc) // spm * spm  # a multiple of spm already without decrease_if_needed
            # steps j = 0 .. n-1 of this batch: P(j) = consumed + j * run still <= SAMPLES and at level k, which
            # holds for j = 0 and, once false, stays false (both sides grow with j); n = the first j where it fails
            lo, hi = 0, (samples - consumed) // run + 1  # P(lo) holds; P(hi) fails (past SAMPLES)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                at = consumed + mid * run
                if at <= samples and level(at) == k:
                    lo = mid
                else:
                    hi = mid
            segments.append(_Segment(first_step=step, first_micro_step=micro, steps=hi, count=run // spm))
            consumed += hi * run
            step += hi
            micro += hi * (run // spm)
        return tuple(segments)

    def locate(self, micro_step: int) -> tuple[int, int, int]:
        """``(step, index, count)``: micro-step ``micro_step`` (from 0) is micro-step ``index`` of training step
        ``step`` (from 0; Megatron's iteration ``step + 1``), which runs ``count`` micro-steps."""
        if isinstance(micro_step, bool) or not isinstance(micro_step, int) or micro_step < 0:
            raise ValueError(f"micro_step must be a non-negative integer, got {micro_step!r}")
        segs = self._segments
        m = self.micro_steps_per_step
        end_step = segs[-1].first_step + segs[-1].steps if segs else 0
        end_micro = segs[-1].first_micro_step + segs[-1].steps * segs[-1].count if segs else 0
        if micro_step >= end_micro:  # after the ramp
            step, index = divmod(micro_step - end_micro, m)
            return end_step + step, index, m
        seg = segs[bisect.bisect_right(self._starts, micro_step) - 1]
        step, index = divmod(micro_step - seg.first_micro_step, seg.count)
        return seg.first_step + step, index, seg.count
