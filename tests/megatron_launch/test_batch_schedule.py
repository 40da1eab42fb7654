"""Micro-steps per training step under Megatron's --rampup-batch-size and --step-batch-size-schedule
(``StepSchedule``), against megatron-core's own ``RampupBatchsizeNumMicroBatchesCalculator`` (megatron-core up to 0.18)
and ``StepBatchsizeNumMicroBatchesCalculator`` (0.19 on) driven as Megatron's training loop drives them, and against a
plain walk over the steps where this megatron-core lacks the calculator."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from zeppelin_megatron.megatron.batch_schedule import RampupError, StepSchedule, parse_step_batch_size_schedule


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
    return drive(calc, spm, micro_steps)


def drive(calc: Any, spm: int, micro_steps: int) -> list[int]:
    """A megatron-core calculator driven as training.py drives it, micro-steps per step until ``micro_steps``."""
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
       samples=st.integers(1, 400), decrease=st.booleans(), extra=st.integers(0, 11))
@example(spm=4, start=1, inc=1, levels=2, samples=16, decrease=False, extra=0)
@example(spm=1, start=3, inc=1, levels=7, samples=29, decrease=False, extra=0)  # a step begins at consumed ==
# SAMPLES, where int(SAMPLES / per_increment) is 6 of 7 increments in floating point: one more ramp step
@example(spm=3, start=1, inc=2, levels=4, samples=7, decrease=True, extra=2)
def test_matches_megatron_cores_calculator(spm: int, start: int, inc: int, levels: int, samples: int,
                                          decrease: bool, extra: int) -> None:
    """Without --decrease-batch-size-if-needed START and INCREMENT are multiples of the micro-step's samples; with
    it, any INCREMENT, a START that is not, and a global batch that is not (``extra`` samples over; every batch
    rounded down)."""
    if not decrease:
        rampup = (start * spm, inc * spm, samples)
        gbs = rampup[0] + levels * rampup[1]
    else:
        gbs = spm * (-(-(spm + levels * inc) // spm) + start) + extra % spm  # START = GBS - levels x INCREMENT
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


@pytest.mark.parametrize("spm, gbs", [(32, 100), (4, 4), (7, 13), (16, 31)])
def test_constant_batch_rounded_down_as_megatron_core_does(spm: int, gbs: int) -> None:
    """--decrease-batch-size-if-needed without a ramp: every step runs GBS rounded down to whole micro-steps
    (megatron-core's ConstantNumMicroBatchesCalculator)."""
    s = StepSchedule(samples_per_micro_step=spm, global_batch_size=gbs, decrease_if_needed=True)
    assert s.micro_steps_per_step == gbs // spm and s.locate(3 * (gbs // spm)) == (3, 0, gbs // spm)
    calc_module = pytest.importorskip("megatron.core.num_microbatches_calculator")
    mbs = 1 if spm % 2 else 2
    calc = calc_module.ConstantNumMicroBatchesCalculator(gbs, mbs, spm // mbs, True, 1)
    assert calc.get() == s.micro_steps_per_step
    with pytest.raises(RampupError, match="--global-batch-size 3 with --decrease-batch-size-if-needed: less than "
                       "one micro-step's 4 samples"):
        StepSchedule(samples_per_micro_step=4, global_batch_size=3, decrease_if_needed=True)


def walk_steps(spm: int, entries: tuple[tuple[int, int], ...], consumed: int, micro_steps: int) -> list[int]:
    """Micro-steps of each step from ``consumed`` on, walking the schedule's rule step by step (module docstring)."""
    done, counts = 0, []
    while done < micro_steps:
        batch = [b for t, b in entries if t <= consumed][-1]
        counts.append(batch // spm)
        consumed += batch
        done += counts[-1]
    return counts


def step_calculator() -> Any:
    """megatron-core's ``StepBatchsizeNumMicroBatchesCalculator``, or ``None`` where it has none (before 0.19, where
    Megatron-LM had no --step-batch-size-schedule: the plain walk checks the schedule there)."""
    try:
        module = importlib.import_module("megatron.core.num_microbatches_calculator")
    except ImportError:
        return None
    return getattr(module, "StepBatchsizeNumMicroBatchesCalculator", None)


def megatron_schedule_steps(calculator: Any, spm: int, text: str, seq_length: int, micro_steps: int) -> list[int]:
    """As :func:`megatron_steps`, from megatron-core's step-schedule ``calculator`` class."""
    mbs = 1 if spm % 2 else 2
    calc = calculator(
        micro_batch_size=mbs, data_parallel_size=spm // mbs, decrease_batch_size_if_needed=False, rank=1,
        schedule=text, seq_length=seq_length)
    return drive(calc, spm, micro_steps)


def test_step_schedule_worked_example() -> None:
    entries = parse_step_batch_size_schedule("0:4 50:8 100:16", 10)
    assert entries == ((0, 4), (5, 8), (10, 16))
    s = StepSchedule(samples_per_micro_step=4, global_batch_size=4, step_batch_sizes=entries)
    assert schedule_steps(s, 16) == [1, 1, 2, 4, 4, 4]
    assert s.first_micro_steps == 1 and s.micro_steps_per_step == 4


def test_step_schedule_is_read_as_megatron_core_reads_it() -> None:
    """Suffixes, fractions, commas, order, tokens // seq_length (megatron-core's own parser where it has one)."""
    text = "2.4B:320, 0:16 1.2b:0.1K 7.2B:928"
    assert parse_step_batch_size_schedule(text, 4096) == ((0, 16), (292968, 100), (585937, 320), (1757812, 928))
    assert parse_step_batch_size_schedule(text, None)[1] == (1_200_000_000, 100)
    calc = step_calculator()
    if calc is not None:
        for seq in (None, 4096, 7):
            assert parse_step_batch_size_schedule(text, seq) == tuple(calc._parse_schedule(text, seq))


@settings(max_examples=150, deadline=None)
@given(spm=st.integers(1, 8), data=st.data())
def test_step_schedule_matches_megatron(spm: int, data: st.DataObject) -> None:
    """Random schedules of non-decreasing batches (multiples of the micro-step) at random token thresholds: the same
    micro-steps per step as megatron-core's calculator (0.19 on) or the plain walk; a resumed schedule, anchored at
    any step boundary, agrees with the fresh one from there on."""
    seq_length = data.draw(st.integers(1, 64))
    n = data.draw(st.integers(1, 5))
    multiples = sorted(data.draw(st.lists(st.integers(1, 6), min_size=n, max_size=n)))
    gaps = data.draw(st.lists(st.integers(1, 40 * seq_length), min_size=n - 1, max_size=n - 1))
    tokens = [0]
    for g in gaps:
        tokens.append(tokens[-1] + g)
    words = [f"{t}:{m * spm}" for t, m in zip(tokens, multiples)]
    text = " ".join(data.draw(st.permutations(words)))
    calculator = step_calculator()
    try:
        entries = parse_step_batch_size_schedule(text, seq_length)
    except RampupError:  # two thresholds within one sample of tokens: megatron-core refuses them too
        if calculator is not None:
            with pytest.raises(AssertionError, match="strictly increasing"):
                megatron_schedule_steps(calculator, spm, text, seq_length, 1)
        return
    s = StepSchedule(samples_per_micro_step=spm, global_batch_size=spm, step_batch_sizes=entries)
    s.check()
    total = entries[-1][0] // spm + 4 * multiples[-1] + 3
    ours = schedule_steps(s, total)
    assert ours[:-1] == walk_steps(spm, entries, 0, total)[:-1]
    if calculator is not None:
        assert ours[:-1] == megatron_schedule_steps(calculator, spm, text, seq_length, total)[:-1]
    k = data.draw(st.integers(0, len(ours) - 1))
    step_start = sum(ours[:k])  # micro-step where step k begins
    resumed = s.resumed(step=k, consumed=step_start * spm)
    for m in range(step_start, total):
        assert resumed.locate(m) == s.locate(m)


@pytest.mark.parametrize("text, seq, match", [
    ("", None, "give entries THRESHOLD:BATCH"),
    ("0:16 100", None, "entry '100': expected THRESHOLD:BATCH"),
    ("0:16 1X:32", None, "'1X' is not a number"),
    ("0:16 inf:32", None, "'inf' is not a number"),
    ("10:16", None, "the first threshold must be 0, got 10 samples"),
    ("0:16 100:32 100:64", None, "strictly increasing in samples, got 100 then 100"),
    ("0:16 100:0", None, "batch sizes must be positive, got 0"),
])
def test_step_schedules_megatron_refuses_are_refused(text: str, seq: int | None, match: str) -> None:
    with pytest.raises(RampupError, match=match):
        parse_step_batch_size_schedule(text, seq)


def test_step_schedule_run_time_rules() -> None:
    """Megatron fails mid-run on a batch that is not whole micro-steps and on fewer micro-steps than the step before:
    :meth:`StepSchedule.check` says so first, for the steps up to the end of training only."""
    s = StepSchedule(samples_per_micro_step=4, global_batch_size=4, step_batch_sizes=((0, 8), (16, 6), (40, 12)))
    s.check(end_step=2)  # steps at consumed 0 and 8 run 8 samples
    with pytest.raises(RampupError, match="step 3 \\(at 16 samples consumed\\) runs a batch of 6"):
        s.check()
    with pytest.raises(RampupError, match="step 3 .* runs a batch of 6"):
        s.locate(5)
    assert s.locate(3) == (1, 1, 2)
    falling = StepSchedule(samples_per_micro_step=4, global_batch_size=4, step_batch_sizes=((0, 8), (16, 4)))
    with pytest.raises(RampupError, match="would run 1 micro-steps after 2"):
        falling.check(end_step=3)
    with pytest.raises(RampupError, match="resumes at 6 samples consumed, not a multiple of a micro-step's 4"):
        falling.resumed(step=1, consumed=6).check()
    with pytest.raises(ValueError, match="comes before this schedule's start at 16 samples"):
        falling.resumed(step=2, consumed=16).locate(3)
    with pytest.raises(RampupError, match="megatron-core refuses the pair"):
        StepSchedule(samples_per_micro_step=4, global_batch_size=4, step_batch_sizes=((0, 8),),
                     decrease_if_needed=True)
