"""Which training step a micro-step belongs to, under Megatron's batch-size schedules.

Megatron runs ``batch / (micro_batch_size * N)`` micro-steps per training step (``N``: data-parallel ranks,
Zeppelin's ranks; ``spm = micro_batch_size * N`` samples a micro-step). Before each step Megatron asks its
micro-batch calculator for the step's ``batch`` at ``consumed`` samples consumed so far, runs it and adds it to
``consumed``. Three calculators, one rule each:

* constant (``--global-batch-size GBS``): ``batch = GBS``, rounded down to a multiple of ``spm`` with
  ``--decrease-batch-size-if-needed`` (GBS 100, ``spm`` 32: 96, 3 micro-steps);
* ``--rampup-batch-size START INCREMENT SAMPLES`` (Megatron-LM up to 0.18; megatron-core's
  ``RampupBatchsizeNumMicroBatchesCalculator``)::

      batch = GBS                                                 if consumed > SAMPLES
            = START + int(consumed / per_increment) * INCREMENT   otherwise,
      per_increment = SAMPLES / ((GBS - START) / INCREMENT)  (a float, as megatron-core computes it)

  rounded down to a multiple of ``spm`` with ``--decrease-batch-size-if-needed``;
* ``--step-batch-size-schedule "THRESHOLD:BATCH ..."`` (Megatron-LM 0.19 on; megatron-core's
  ``StepBatchsizeNumMicroBatchesCalculator``): ``batch`` = the BATCH of the last entry whose threshold is
  ``<= consumed``. Thresholds are tokens (Megatron-LM passes ``--seq-length``) turned into samples by
  ``threshold // seq_length``; suffixes K, M, B, T multiply by 1e3, 1e6, 1e9, 1e12.

Every micro-step consumes ``spm`` samples whatever the batch, so the data side needs nothing of this (resume:
:func:`~.data.iterator.from_consumed_samples`); the step metrics group micro-steps into steps with it.

Worked example (ramp): ``spm = 4``, ``--rampup-batch-size 4 4 20``, GBS 12: per_increment = 20 / 2 = 10. Step 0
(consumed 0): batch 4, 1 micro-step; step 1 (consumed 4): 4, 1; step 2 (8): 4, 1; step 3 (12): 8, 2; step 4 (20):
12, 3 (20 is not > 20, but int(20 / 10) = 2 increments is GBS already), and 3 from then on. Micro-steps:
0 | 1 | 2 | 3 4 | 5 6 7 | 8 9 10 | ...

Worked example (step schedule): ``spm = 4``, ``--seq-length 10``, ``"0:4 50:8 100:16"``: thresholds 0, 5 and 10
samples. Steps begin at consumed 0 (4), 4 (4), 8 (8: 8 >= 5), 16 (16: 16 >= 10), 32 (16), ... Micro-steps:
0 | 1 | 2 3 | 4 5 6 7 | 8 9 10 11 | ...

The schedule is kept as segments of equal steps (at most one per ramp increment or schedule entry; a ramp level's
end found by bisection on megatron-core's own float expression), so locating a micro-step costs a search over them,
not a walk over every step. A schedule starts at ``(first_step, first_consumed)``: ``(0, 0)`` for a fresh run,
Megatron's ``(iteration, consumed_train_samples)`` for a resumed one (:meth:`StepSchedule.resumed`), since a
resumed run follows the schedule from where it stands, as Megatron does.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field

__all__ = ["RampupError", "StepSchedule", "parse_step_batch_size_schedule"]

_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


class RampupError(ValueError):
    """A batch-size schedule Megatron cannot run (or would fail on mid-run), named with its numbers."""


def _schedule_number(word: str, entry: str) -> int:
    """One number of a ``--step-batch-size-schedule`` entry as megatron-core reads it: ``int(float(x) * suffix)``."""
    text = word.strip().upper()
    scale = _SUFFIXES.get(text[-1:], 1)
    if scale != 1:
        text = text[:-1]
    try:
        return int(float(text) * scale)
    except (ValueError, OverflowError):
        raise RampupError(f"--step-batch-size-schedule entry {entry!r}: {word!r} is not a number (with an optional "
                          "K, M, B or T suffix)") from None


def parse_step_batch_size_schedule(text: str, seq_length: int | None) -> tuple[tuple[int, int], ...]:
    """``--step-batch-size-schedule`` as ``((threshold_samples, batch), ...)``, sorted, checked as megatron-core
    checks it (an entry at 0, thresholds strictly increasing after conversion, batches positive).

    Entries are separated by spaces or commas; each is ``THRESHOLD:BATCH``. With ``seq_length`` thresholds are
    tokens: ``"0:16 2.4B:320"`` at ``seq_length`` 4096 is ``((0, 16), (585937, 320))`` (2.4e9 // 4096).
    """
    if not isinstance(text, str) or not text.strip():
        raise RampupError(f"--step-batch-size-schedule {text!r}: give entries THRESHOLD:BATCH, e.g. \"0:16 2.4B:320\"")
    entries: list[tuple[int, int]] = []
    for entry in text.replace(",", " ").split():
        if ":" not in entry:
            raise RampupError(f"--step-batch-size-schedule entry {entry!r}: expected THRESHOLD:BATCH")
        threshold_word, batch_word = entry.split(":", 1)
        threshold = _schedule_number(threshold_word, entry)
        if seq_length is not None:
            threshold //= seq_length
        entries.append((threshold, _schedule_number(batch_word, entry)))
    entries.sort(key=lambda e: e[0])
    unit = f" (tokens // --seq-length {seq_length})" if seq_length is not None else ""
    if entries[0][0] != 0:
        raise RampupError(f"--step-batch-size-schedule {text!r}: the first threshold must be 0, got "
                          f"{entries[0][0]} samples{unit}")
    for (t0, _), (t1, _) in zip(entries, entries[1:]):
        if t1 <= t0:
            raise RampupError(f"--step-batch-size-schedule {text!r}: thresholds must be strictly increasing in "
                              f"samples{unit}, got {t0} then {t1}")
    for _, batch in entries:
        if batch < 1:
            raise RampupError(f"--step-batch-size-schedule {text!r}: batch sizes must be positive, got {batch}")
    return tuple(entries)


@dataclass(frozen=True)
class _Segment:
    first_step: int
    first_consumed: int
    steps: int | None  # None: every step from here on
    batch: int  # samples per step (running batch, after --decrease-batch-size-if-needed)


@dataclass(frozen=True, kw_only=True)
class StepSchedule:
    """Micro-steps per training step (module docstring). ``samples_per_micro_step``: ``micro_batch_size * N``;
    ``rampup``: ``(START, INCREMENT, SAMPLES)`` of ``--rampup-batch-size`` or ``None``; ``step_batch_sizes``:
    :func:`parse_step_batch_size_schedule`'s entries or ``None`` (then ``global_batch_size`` is ignored);
    ``first_step``, ``first_consumed``: where the run starts (:meth:`resumed`)."""

    samples_per_micro_step: int
    global_batch_size: int
    rampup: tuple[int, int, int] | None = None
    step_batch_sizes: tuple[tuple[int, int], ...] | None = None
    decrease_if_needed: bool = False
    first_step: int = 0
    first_consumed: int = 0
    _segments: tuple[_Segment, ...] = field(init=False, repr=False, compare=False)
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spm, gbs = self.samples_per_micro_step, self.global_batch_size
        for name, value in (("samples per micro-step", spm), ("--global-batch-size", gbs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RampupError(f"{name} must be a positive integer, got {value!r}")
        for name, value in (("first step", self.first_step), ("first consumed samples", self.first_consumed)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RampupError(f"{name} must be a non-negative integer, got {value!r}")
        if self.rampup is not None and self.step_batch_sizes is not None:
            raise RampupError("--rampup-batch-size and --step-batch-size-schedule exclude each other")
        if self.step_batch_sizes is not None:
            if self.decrease_if_needed:
                raise RampupError("--step-batch-size-schedule with --decrease-batch-size-if-needed: megatron-core "
                                  "refuses the pair (step schedules never round batches down)")
            if not self.step_batch_sizes or self.step_batch_sizes[0][0] != 0:
                raise RampupError(f"step batch sizes must start at threshold 0, got {self.step_batch_sizes!r}")
        elif self.decrease_if_needed:
            if gbs < spm:
                raise RampupError(f"--global-batch-size {gbs} with --decrease-batch-size-if-needed: less than one "
                                  f"micro-step's {spm} samples (micro-batch size x data-parallel ranks), no micro-step "
                                  "would run")
        elif gbs % spm:
            raise RampupError(f"--global-batch-size {gbs} is not a multiple of {spm} samples per micro-step")
        if self.rampup is not None:
            self._check_rampup()
        segments = self._build()
        object.__setattr__(self, "_segments", segments)
        object.__setattr__(self, "_starts", tuple(s.first_consumed for s in segments))

    def resumed(self, *, step: int, consumed: int) -> StepSchedule:
        """The same schedule for a run that resumes at Megatron's iteration ``step`` with ``consumed`` samples."""
        return dataclasses.replace(self, first_step=step, first_consumed=consumed)

    @property
    def micro_steps_per_step(self) -> int:
        """From the last change on (without a ramp or schedule: ``global_batch_size / samples_per_micro_step``),
        rounded down where that batch is not whole micro-steps, which Megatron would fail on (:meth:`check`)."""
        return self._segments[-1].batch // self.samples_per_micro_step

    @property
    def first_micro_steps(self) -> int:
        """Micro-steps of the run's first step."""
        return self._segments[0].batch // self.samples_per_micro_step

    # -- Megatron's rules --------------------------------------------------------------------------------------

    def _check_rampup(self) -> None:
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

    def check(self, end_step: int | None = None) -> None:
        """Megatron's run-time rules for the steps from ``first_step`` up to ``end_step`` (exclusive; ``None``: all),
        checked before they run: every step's batch a multiple of a micro-step's samples (megatron-core's
        consistency check) and never fewer micro-steps than the step before (training.py's assertion). A ramp meets
        both by construction; a step schedule may not (megatron-core checks its batches only as steps reach them,
        so that entries a resumed run has passed may suit another job size)."""
        spm, prev = self.samples_per_micro_step, None
        what = "--step-batch-size-schedule" if self.step_batch_sizes is not None else "the batch schedule"
        if self.first_consumed % spm:
            raise RampupError(f"{what}: the run resumes at {self.first_consumed} samples consumed, not a multiple of "
                              f"a micro-step's {spm} samples (micro-batch size x data-parallel ranks)")
        for seg in self._segments:
            if end_step is not None and seg.first_step >= end_step:
                break
            if seg.batch % spm:
                raise RampupError(f"{what}: step {seg.first_step + 1} (at {seg.first_consumed} samples consumed) "
                                  f"runs a batch of {seg.batch}, not a multiple of a micro-step's {spm} samples "
                                  "(micro-batch size x data-parallel ranks); Megatron would fail there")
            if prev is not None and seg.batch < prev:
                raise RampupError(f"{what}: step {seg.first_step + 1} (at {seg.first_consumed} samples consumed) "
                                  f"would run {seg.batch // spm} micro-steps after {prev // spm}; Megatron's "
                                  "training loop refuses a falling number of micro-steps")
            prev = seg.batch

    # -- segments ----------------------------------------------------------------------------------------------

    def _piece(self, consumed: int) -> tuple[int, int | None]:
        """``(batch, end)``: the running batch of a step begun at ``consumed``, and the least consumed count from
        which the batch may change (``None``: never again)."""
        if self.step_batch_sizes is not None:
            entries = self.step_batch_sizes
            k = bisect.bisect_right([t for t, _ in entries], consumed) - 1
            return entries[k][1], (entries[k + 1][0] if k + 1 < len(entries) else None)
        if self.rampup is None:
            return self._running(self.global_batch_size), None
        start, inc, samples = self.rampup
        if consumed > samples:
            return self._running(self.global_batch_size), None
        per_increment = samples / ((self.global_batch_size - start) // inc)  # megatron-core's float

        def level(c: int) -> int:
            return int(c / per_increment)

        k = level(consumed)
        batch = self._running(start + k * inc)
        # the least c > consumed with c > SAMPLES or level(c) > k: level is monotone, so bisect on (lo, hi]
        lo, hi = consumed, samples + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if level(mid) > k:
                hi = mid
            else:
                lo = mid
        return batch, hi

    def _running(self, batch: int) -> int:
        """The batch a step runs: ``batch``, rounded down to whole micro-steps with --decrease-batch-size-if-needed
        (megatron-core's calculators)."""
        spm = self.samples_per_micro_step
        return batch // spm * spm if self.decrease_if_needed else batch

    def _build(self) -> tuple[_Segment, ...]:
        segments: list[_Segment] = []
        step, consumed = self.first_step, self.first_consumed
        while True:
            batch, end = self._piece(consumed)
            if end is None:
                segments.append(_Segment(step, consumed, None, batch))
                return tuple(segments)
            assert end > consumed, (end, consumed)  # each piece holds a step: the loop advances
            steps = -(-(end - consumed) // batch)  # steps begun before `end`
            segments.append(_Segment(step, consumed, steps, batch))
            step, consumed = step + steps, consumed + steps * batch

    def locate(self, micro_step: int) -> tuple[int, int, int]:
        """``(step, index, count)``: micro-step ``micro_step`` (from 0, the run's micro-steps counted from consumed
        0, so the first of a resumed run is ``first_consumed / samples_per_micro_step``) is micro-step ``index`` of
        training step ``step`` (from 0; Megatron's iteration ``step + 1``), which runs ``count`` micro-steps."""
        if isinstance(micro_step, bool) or not isinstance(micro_step, int) or micro_step < 0:
            raise ValueError(f"micro_step must be a non-negative integer, got {micro_step!r}")
        spm = self.samples_per_micro_step
        consumed = micro_step * spm
        if consumed < self.first_consumed:
            raise ValueError(f"micro-step {micro_step} ({consumed} samples) comes before this schedule's start at "
                             f"{self.first_consumed} samples consumed")
        seg = self._segments[bisect.bisect_right(self._starts, consumed) - 1]
        if seg.batch % spm or seg.first_consumed % spm:
            self.check()  # raises, naming the step
            raise AssertionError("unreachable")  # pragma: no cover
        step, within = divmod(consumed - seg.first_consumed, seg.batch)
        return seg.first_step + step, within // spm, seg.batch // spm
