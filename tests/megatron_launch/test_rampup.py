"""Micro-steps per training step under Megatron's --rampup-batch-size (``StepSchedule``), against megatron-core's own
``RampupBatchsizeNumMicroBatchesCalculator`` driven as Megatron's training loop drives it."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from zeppelin_megatron.megatron.rampup import RampupError, StepSchedule


def megatron_steps(spm: int, gbs: int, rampup: tuple[int, int, int], decrease: bool, micro_steps: int
                   ) -> list[int]:
    """Micro-steps of each step until ``micro_steps`` have run, from megatron-core's calculator: before each step
    ``update(consumed, consistency_check=True)``, then ``consumed += num_micro_batches * spm`` (training.py)."""
    calc_module = pytest.importorskip("megatron.core.num_microbatches_calculator")
    if not hasattr(calc_module, "RampupBatchsizeNumMicroBatchesCalculator"):
        pytest.skip("this megatron-core has no RampupBatchsizeNumMicroBatchesCalculator (from 0.19 Megatron-LM has no "
                    "--rampup-batch-size; --step-batch-size-schedule replaced it)")
    mbs = 1 if spm % 2 else 2  # any split of spm into micro-batch size x data-parallel size
    calc = calc_module.RampupBatchsizeNumMicroBatchesCalculator(
        global_batch_size=gbs, micro_batch_size=mbs, data_parallel_size=spm // mbs,
        decrease_batch_size_if_needed=decrease, rank=1, start_global_batch_size=rampup[0],
        batch_size_increment=rampup[1], ramup_samples=rampup[2])
    consumed, done, counts = 0, 0, []
    while done < micro_steps:
        calc.update(consumed, consistency_check=True)
        counts.append(calc.get())
        consumed += counts[-1] * spm
        done += counts[-1]
    return counts


def schedule_steps(schedule: StepSchedule, micro_steps: int) -> list[int]:
    counts: list[int] = []
    for m in range(micro_steps):
        step, index, count = schedule.locate(m)
        if index == 0:
            assert step == len(counts)
            counts.append(count)
        assert step == len(counts) - 1 and count == counts[-1] and 0 <= index < count
    return counts


def test_worked_example() -> None:
    s = StepSchedule(samples_per_micro_step=4, global_batch_size=12, rampup=(4, 4, 20))
    assert schedule_steps(s, 14) == [1, 1, 1, 2, 3, 3, 3]
    assert s.locate(7) == (4, 2, 3) and s.locate(10**9) == (5 + (10**9 - 8) // 3, (10**9 - 8) % 3, 3)
    assert StepSchedule(samples_per_micro_step=4, global_batch_size=12).locate(7) == (2, 1, 3)


@settings(max_examples=200, deadline=None)
@given(spm=st.integers(1, 12), start=st.integers(1, 6), inc=st.integers(1, 9), levels=st.integers(1, 5),
       samples=st.integers(1, 400), decrease=st.booleans())
@example(spm=4, start=1, inc=1, levels=2, samples=16, decrease=False)
@example(spm=1, start=3, inc=1, levels=7, samples=29, decrease=False)  # a step begins at consumed == SAMPLES, where
# int(SAMPLES / per_increment) is 6 of 7 increments in floating point: one more ramp step
@example(spm=3, start=1, inc=2, levels=4, samples=7, decrease=True)
def test_matches_megatron_cores_calculator(spm: int, start: int, inc: int, levels: int, samples: int,
                                          decrease: bool) -> None:
    """Without --decrease-batch-size-if-needed START and INCREMENT are multiples of the micro-step's samples; with
    it, any INCREMENT and a START that is not (batches rounded down)."""
    if not decrease:
        rampup = (start * spm, inc * spm, samples)
        gbs = rampup[0] + levels * rampup[1]
    else:
        gbs = spm * (-(-(spm + levels * inc) // spm) + start)  # a multiple of spm, START = GBS - levels x INCREMENT
        rampup = (gbs - levels * inc, inc, samples)
    s = StepSchedule(samples_per_micro_step=spm, global_batch_size=gbs, rampup=rampup, decrease_if_needed=decrease)
    n = samples // spm + 4 * (gbs // spm) + 3
    assert schedule_steps(s, n)[:-1] == megatron_steps(spm, gbs, rampup, decrease, n)[:-1]


@pytest.mark.parametrize("kwargs, match", [
    ({"rampup": (16, 16, 0)}, "must be positive"),
    ({"rampup": (64, 16, 100)}, "must be START plus a positive multiple of INCREMENT"),
    ({"rampup": (16, 32, 100)}, "must be START plus a positive multiple"),
    ({"rampup": (8, 8, 100)}, "START and INCREMENT must be multiples of the 16 samples"),
    ({"rampup": (8, 8, 100), "decrease_if_needed": True}, "START 8 is less than one micro-step's 16 samples"),
    ({"global_batch_size": 40}, "--global-batch-size 40 is not a multiple of 16"),
])
def test_ramps_megatron_cannot_run_are_refused(kwargs: dict, match: str) -> None:
    args = {"samples_per_micro_step": 16, "global_batch_size": 64, **kwargs}
    with pytest.raises(RampupError, match=match):
        StepSchedule(**args)
