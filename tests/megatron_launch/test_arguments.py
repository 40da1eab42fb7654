"""Our flags on a plain argparse parser, and the start-up checks on Megatron-like namespaces."""

from __future__ import annotations

import argparse

import pytest

from zeppelin_megatron.megatron.arguments import (
    PlannerOptions,
    ZeppelinArgsError,
    ZeppelinConfig,
    add_zeppelin_args,
    zeppelin_config_from_args,
    zeppelin_requested,
)
from zeppelin_megatron.megatron.run_shape import ZeppelinParallel, check_megatron_args, train_data_consumed

from .helpers import megatron_namespace


def _parse(argv: list[str]) -> argparse.Namespace:
    return add_zeppelin_args(argparse.ArgumentParser(allow_abbrev=False)).parse_args(argv)


def test_flags_defaults_and_negations() -> None:
    a = _parse(["--zeppelin", "--zeppelin-cluster", "2x8"])
    cfg = zeppelin_config_from_args(a)
    assert cfg == ZeppelinConfig(cluster="2x8")
    assert cfg.routing and cfg.metrics and cfg.backend is None
    assert not cfg.check_plan  # the first attention layer of each forward checks anyway (failures.md)
    assert zeppelin_config_from_args(_parse(["--zeppelin", "--zeppelin-cluster", "2x8",
                                             "--zeppelin-check-plan"])).check_plan
    assert cfg.options == PlannerOptions()           # the planner's defaults, token-balanced linear layout
    auto = zeppelin_config_from_args(_parse(["--zeppelin", "--zeppelin-cluster", "2x8", "--zeppelin-remap-auto"]))
    assert auto.options.remap == "auto"              # decided per micro-step
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-remap-auto and --no-zeppelin-remap"):
        zeppelin_config_from_args(_parse(["--zeppelin", "--zeppelin-cluster", "2x8", "--zeppelin-remap-auto",
                                          "--no-zeppelin-remap"]))
    b = _parse(["--zeppelin", "--zeppelin-cluster", "2x8", "--no-zeppelin-routing", "--no-zeppelin-remap",
                "--zeppelin-tokens-per-gpu", "4096", "--zeppelin-backend", "reference",
                "--zeppelin-placements", "local,intra_node", "--no-zeppelin-metrics"])
    cfg = zeppelin_config_from_args(b)
    assert (cfg.routing, cfg.options.remap, cfg.metrics) == (False, False, False)
    assert cfg.tokens_per_gpu == 4096 and cfg.backend == "reference"
    assert cfg.options == PlannerOptions(routing=False, remap=False, placements=("local", "intra_node"))


def test_plan_worker_flag() -> None:
    assert zeppelin_config_from_args(_parse(["--zeppelin", "--zeppelin-cluster", "2x8"])).plan_worker
    off = _parse(["--zeppelin", "--zeppelin-cluster", "2x8", "--zeppelin-plan-worker", "off"])
    assert not zeppelin_config_from_args(off).plan_worker
    with pytest.raises(SystemExit):
        _parse(["--zeppelin", "--zeppelin-plan-worker", "maybe"])
    with pytest.raises(ZeppelinArgsError, match="--zeppelin-plan-worker must be on or off, got 1"):
        ZeppelinConfig(cluster="2x8", plan_worker=1)  # type: ignore[arg-type]


def test_unknown_backend_rejected_by_parser() -> None:
    with pytest.raises(SystemExit):
        _parse(["--zeppelin", "--zeppelin-backend", "nope"])


def test_zeppelin_requested() -> None:
    assert zeppelin_requested(["x.py", "--zeppelin", "--seq-length", "8"])
    assert not zeppelin_requested(["x.py", "--zeppelin-cluster", "2x8"])


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--zeppelin"], "needs --zeppelin-cluster"),
        (["--zeppelin", "--zeppelin-cluster", "2x8", "--zeppelin-tokens-per-gpu", "0"], "positive integer, got 0"),
        (["--zeppelin", "--zeppelin-cluster", "2x8", "--zeppelin-placements", "local,ring"],
         r"--zeppelin-placements local,ring: placements \['local', 'ring'\]: expected distinct names"),
        (["--zeppelin", "--zeppelin-cluster", "2x8", "--zeppelin-placements", "intra_node"],
         "--zeppelin-placements intra_node: .*'local' cannot"),
        (["--zeppelin", "--zeppelin-cluster", "2x8", "--zeppelin-slack", "1.5"],
         r"--zeppelin-slack 1.5: slack is 1.5, expected a fraction in \[0, 1\)"),
        (["--zeppelin", "--zeppelin-cluster", "2x8", "--zeppelin-min-ratio", "0"],
         "--zeppelin-min-ratio 0.0: min_ratio is 0.0, expected a number > 0"),
        (["--zeppelin", "--zeppelin-cluster", "2x8", "--zeppelin-prefetch", "3"], "prefetch must be 0, 1 or 2"),
    ],
)
def test_bad_flags(argv: list[str], match: str) -> None:
    with pytest.raises(ZeppelinArgsError, match=match):
        zeppelin_config_from_args(_parse(argv))


def test_typical_run_shape() -> None:
    p = check_megatron_args(megatron_namespace(tensor_model_parallel_size=2, sequence_parallel=True,
                                               global_batch_size=64), world_size=32, gpus_per_node=8)
    assert (p.nodes, p.zeppelin_ranks, p.zeppelin_ranks_per_node) == (4, 16, 4)
    assert p.token_budget == 1 * 32768 * 16
    assert p.num_micro_batches == 64 // 16
    assert p.pad_to_multiple == 2


@pytest.mark.parametrize("flags, multiple", [
    ({"fp8": "hybrid", "fp8_recipe": "delayed"}, 16),
    ({"fp8": "e4m3", "fp8_recipe": "mxfp8"}, 32),
    ({"fp4": "e2m1", "fp4_recipe": "nvfp4"}, 128),
    ({"fp8": "hybrid", "fp8_recipe": "tensorwise", "tensor_model_parallel_size": 2, "sequence_parallel": True}, 32),
    ({"fp8": "hybrid", "fp8_recipe": "delayed", "tensor_model_parallel_size": 2}, 16),
])
def test_low_precision_gemms_get_aligned_rows(flags: dict, multiple: int) -> None:
    """--fp8-format / --fp4-format: every rank's linear-layout rows are padded to megatron-core's GEMM alignment
    (get_fp8_align_size, get_fp4_align_size), times TP under sequence parallelism (each TP rank quantizes its share
    of the rows); Transformer Engine refuses unaligned rows (the equivalence tests check padded rows change no
    loss or gradient)."""
    p = check_megatron_args(megatron_namespace(**flags), world_size=32, gpus_per_node=8)
    assert p.pad_to_multiple == multiple


def test_default_global_batch_is_one_micro_batch_per_rank() -> None:
    p = check_megatron_args(megatron_namespace(global_batch_size=None, micro_batch_size=2),
                            world_size=16, gpus_per_node=8)
    assert p.global_batch_size == 32 and p.num_micro_batches == 1


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"pipeline_model_parallel_size": 2}, "--pipeline-model-parallel-size 2"),
        ({"context_parallel_size": 2}, "--context-parallel-size 2"),
        ({"num_experts": 8}, "MoE"),
        ({"calculate_per_token_loss": False}, "--calculate-per-token-loss"),
        ({"dataloader_type": "single"}, "--dataloader-type single"),
        ({"spec": ["megatron.core.models.gpt.gpt_layer_specs", "x"]}, "drop --spec"),
        ({"data_path": None}, "needs --data-path"),
        ({"data_path": ["0.5", "a", "b", "c"]}, "--data-path 0.5 a b c: give a weight before every prefix"),
        ({"valid_data_path": ["1", "a", "0", "b"], "eval_iters": 1}, "--valid-data-path: weight 0.0 for b"),
        ({"eval_iters": 10, "split": "100,0,0"}, "--valid-data-path PREFIX or on the validation share"),
        ({"split": "0,90,10"}, "--split 0,90,10: gives training no share"),
        ({"split": "a,b"}, "--split 'a,b': give up to three non-negative shares"),
        ({"use_legacy_models": True}, "--use-legacy-models"),
        ({"cuda_graph_impl": "transformer_engine"}, "--cuda-graph-impl transformer_engine: a CUDA graph replays "
         "fixed shapes"),
        ({"enable_cuda_graph": True, "cuda_graph_impl": "none"}, "--enable-cuda-graph: a CUDA graph replays"),
        ({"full_validation": True, "eval_iters": 0}, "--full-validation: Megatron sizes a full pass"),
        ({"multiple_validation_sets": True, "valid_data_path": ["a", "b"], "eval_iters": 1},
         "--multiple-validation-sets: Zeppelin evaluates one validation set"),
        ({"attention_dropout": 0.1}, "--attention-dropout 0.1: Zeppelin attention has no attention dropout"),
        ({"window_size": (4096, 0)}, "--window-size \\(4096, 0\\): sliding-window attention is not supported"),
        ({"softmax_type": "learnable"}, "--softmax-type learnable: attention sinks are not supported"),
        ({"tp_comm_overlap": True, "tensor_model_parallel_size": 2, "sequence_parallel": True},
         "--tp-comm-overlap: Transformer Engine's TP communication/GEMM overlap runs on userbuffers of a fixed"),
        ({"rampup_batch_size": ["16", "16", "1000"]}, "--rampup-batch-size 16 16 1000: START and INCREMENT must be "
         "multiples of the 32 samples of a micro-step"),
        ({"rampup_batch_size": ["32", "32"]}, "--rampup-batch-size 32 32: give three integers"),
        ({"step_batch_size_schedule": "0:32,1000:64"}, "--step-batch-size-schedule '0:32,1000:64' with "
         "--global-batch-size 64: give one"),
        ({"step_batch_size_schedule": "0:32,50:64", "global_batch_size": None, "seq_length": 100},
         "thresholds must be strictly increasing in samples \\(tokens // --seq-length 100\\), got 0 then 0"),
        ({"step_batch_size_schedule": "0:32 5K", "global_batch_size": None}, "entry '5K': expected THRESHOLD:BATCH"),
        ({"step_batch_size_schedule": "0:32 1M:64", "global_batch_size": None, "decrease_batch_size_if_needed": True},
         "megatron-core refuses the pair"),
        ({"rampup_batch_size": ["32", "32", "64"], "train_iters": 100}, "--train-iters 100: a ramp-up needs "
         "sample-based training"),
        ({"rampup_batch_size": ["32", "x", "9"]}, "--rampup-batch-size 32 x 9: give three integers"),
        ({"rampup_batch_size": ["32", "24", "100"], "decrease_batch_size_if_needed": True},
         "--global-batch-size 64 must be START plus a positive multiple of INCREMENT"),
        ({"mock_data": True}, "give --mock-data or --data-path, not both"),
    ],
)
def test_unservable_megatron_settings(overrides: dict, match: str) -> None:
    with pytest.raises(ZeppelinArgsError, match=match):
        check_megatron_args(megatron_namespace(**overrides), world_size=32, gpus_per_node=8)


def test_a_batch_size_ramp_up_is_megatrons() -> None:
    """--rampup-batch-size START INCREMENT SAMPLES: the micro-steps of each step grow as megatron-core grows them
    (test_rampup.py checks the schedule against its calculator); the data side is unchanged."""
    p = check_megatron_args(megatron_namespace(rampup_batch_size=["32", "32", "64"]), world_size=32, gpus_per_node=8)
    assert p.rampup == (32, 32, 64) and p.num_micro_batches == 2
    assert [p.schedule.locate(m) for m in range(5)] == [(0, 0, 1), (1, 0, 1), (2, 0, 2), (2, 1, 2), (3, 0, 2)]
    p = check_megatron_args(megatron_namespace(rampup_batch_size=["40", "24", "64"],
                                               decrease_batch_size_if_needed=True), world_size=32, gpus_per_node=8)
    assert p.schedule.locate(0) == (0, 0, 1)  # 40 samples rounded down to one micro-step of 32


def test_decrease_batch_size_if_needed_rounds_the_batch_down() -> None:
    """--global-batch-size 100 on 32 Zeppelin ranks: refused (Megatron's rule), or 96 samples a step (3 micro-steps)
    with --decrease-batch-size-if-needed, as Megatron rounds it."""
    with pytest.raises(ZeppelinArgsError, match="--global-batch-size 100 is not a multiple of --micro-batch-size 1 x "
                       "32 Zeppelin ranks = 32 \\(Megatron's rule; --decrease-batch-size-if-needed rounds"):
        check_megatron_args(megatron_namespace(global_batch_size=100), world_size=32, gpus_per_node=8)
    p = check_megatron_args(megatron_namespace(global_batch_size=100, decrease_batch_size_if_needed=True),
                            world_size=32, gpus_per_node=8)
    assert p.num_micro_batches == 3 and p.schedule.locate(7) == (2, 1, 3)


def test_a_step_batch_size_schedule_is_megatrons() -> None:
    """--step-batch-size-schedule (Megatron-LM 0.19 on): thresholds in tokens, // --seq-length, batches by consumed
    samples (test_batch_schedule.py checks the schedule against megatron-core's calculator); Megatron's run-time rules
    checked for the steps training will run, from where a resumed run stands."""
    args = megatron_namespace(step_batch_size_schedule="0:32 1M:64 3M:128", global_batch_size=None,
                              seq_length=32768, _is_global_batch_size_explicitly_specified=False)
    p = check_megatron_args(args, world_size=32, gpus_per_node=8)
    # thresholds 1e6 // 32768 = 30 and 3e6 // 32768 = 91 samples: steps at consumed 0 (32), 32 (64), 96 (128), ...
    assert p.global_batch_size == 32 and p.num_micro_batches == 4
    assert [p.schedule.locate(m)[::2] for m in (0, 1, 2, 3, 6, 7)] == [(0, 1), (1, 2), (1, 2), (2, 4), (2, 4), (3, 4)]
    p.schedule_from(iteration=0, consumed_samples=0, train_iters=10)
    resumed = p.schedule_from(iteration=2, consumed_samples=96, train_iters=10)
    assert resumed.locate(3) == (2, 0, 4)
    bad = check_megatron_args(megatron_namespace(step_batch_size_schedule="0:32 1M:48", global_batch_size=None,
                                                 seq_length=32768), world_size=32, gpus_per_node=8)
    bad.schedule_from(iteration=0, consumed_samples=0, train_iters=1)  # the 48-sample steps come after the end
    with pytest.raises(ZeppelinArgsError, match="step 2 \\(at 32 samples consumed\\) runs a batch of 48, not a "
                       "multiple of a micro-step's 32 samples"):
        bad.schedule_from(iteration=0, consumed_samples=0, train_iters=2)
    falling = check_megatron_args(megatron_namespace(step_batch_size_schedule="0:64 1M:32", global_batch_size=None,
                                                     seq_length=32768), world_size=32, gpus_per_node=8)
    with pytest.raises(ZeppelinArgsError, match="would run 1 micro-steps after 2"):
        falling.schedule_from(iteration=0, consumed_samples=0, train_iters=None)
    # a job rescaled from 16 data-parallel ranks resumes past an entry of 16 samples, a batch this job cannot run
    rescaled = check_megatron_args(megatron_namespace(step_batch_size_schedule="0:16 192:64", global_batch_size=None,
                                                      seq_length=1), world_size=32, gpus_per_node=8)
    with pytest.raises(ZeppelinArgsError, match="step 1 \\(at 0 samples consumed\\) runs a batch of 16"):
        rescaled.schedule_from(iteration=0, consumed_samples=0, train_iters=None)
    assert rescaled.schedule_from(iteration=12, consumed_samples=192, train_iters=20).locate(7) == (12, 1, 2)


def test_phase_transitions_resume_the_phases_own_data() -> None:
    """--phase-transition-iterations (Megatron-LM 0.19 on): each phase reads its data from the start, the run
    stopping at every transition; the training data resumes after the current phase's samples, counted as
    Megatron's data loader counts them (iterations x --global-batch-size)."""
    def consumed(phases: object, iteration: int) -> int:
        return train_data_consumed(megatron_namespace(phase_transition_iterations=phases, iteration=iteration,
                                                      consumed_train_samples=iteration * 64))
    assert consumed(None, 1500) == 1500 * 64
    for phases in ("3000, 1000", [1000, 3000]):  # as given, and as Megatron's validate_args leaves it
        assert [consumed(phases, it) for it in (0, 500, 1000, 1500, 3000, 3200)] == [0, 500 * 64, 0, 500 * 64, 0,
                                                                                     200 * 64]
    with pytest.raises(ZeppelinArgsError, match="--phase-transition-iterations '1000,x': give iterations"):
        consumed("1000,x", 5)
    with pytest.raises(ZeppelinArgsError, match="--phase-transition-iterations with --step-batch-size-schedule "
                       "'0:32 1M:64': Megatron counts a phase's samples"):
        check_megatron_args(megatron_namespace(phase_transition_iterations="100", step_batch_size_schedule="0:32 1M:64",
                                               global_batch_size=None), world_size=32, gpus_per_node=8)


def test_rampup_is_ignored_where_megatron_ignores_it() -> None:
    """Megatron-LM 0.19 on still parses --rampup-batch-size but never passes it to the calculator: the batch is
    constant, and Zeppelin's schedule follows Megatron's, saying so at start-up."""
    args = megatron_namespace(rampup_batch_size=["32", "32", "64"], step_batch_size_schedule=None, train_iters=100)
    p = check_megatron_args(args, world_size=32, gpus_per_node=8)
    assert p.rampup is None and p.schedule.locate(0) == (0, 0, 2)
    assert p.notes == ("--rampup-batch-size 32 32 64 ignored, as this Megatron-LM ignores it (0.19 on: use "
                       "--step-batch-size-schedule)",)


def test_mock_data_is_a_source_with_a_validation_share() -> None:
    """--mock-data alone (as Megatron requires): megatron-core's mock documents, split 1,1,1 whatever --split says,
    so --eval-iters has a validation set (tests/megatron_data/test_mock.py checks the documents)."""
    check_megatron_args(megatron_namespace(mock_data=True, data_path=None, eval_iters=10, split="100,0,0"),
                        world_size=32, gpus_per_node=8)


def test_document_reset_flags_are_what_zeppelin_does() -> None:
    """--reset-position-ids / --reset-attention-mask (positions and attention restart at every document of a packed
    sample) describe what Zeppelin always does (documents whole, positions from 0): accepted."""
    check_megatron_args(megatron_namespace(reset_position_ids=True, reset_attention_mask=True), world_size=32,
                        gpus_per_node=8)


def test_evaluation_on_the_split_of_data_path() -> None:
    """--eval-iters without --valid-data-path: the validation share of --split (Megatron's default 969,30,1 when
    unset) is evaluated on."""
    for split in (None, "90,10,0"):
        check_megatron_args(megatron_namespace(eval_iters=10, split=split), world_size=32, gpus_per_node=8)


@pytest.mark.parametrize("data_path", [["0.3", "/d/a", "0.7", "/d/b"], ["/d/a", "/d/b"], ["1", "/d/a"]])
def test_blends_are_accepted(data_path: list[str]) -> None:
    """Megatron's blend forms (weights and prefixes, prefixes by size, one weighted prefix) pass the checks."""
    p = check_megatron_args(megatron_namespace(data_path=data_path, valid_data_path=data_path, eval_iters=1),
                            world_size=32, gpus_per_node=8)
    assert p.zeppelin_ranks == 32


def test_all_problems_reported_together() -> None:
    with pytest.raises(ZeppelinArgsError) as exc:
        check_megatron_args(megatron_namespace(pipeline_model_parallel_size=2, context_parallel_size=4),
                            world_size=32, gpus_per_node=8)
    assert "pipeline" in str(exc.value) and "context" in str(exc.value)


def test_attention_backend_local_rejected() -> None:
    class Local:  # stands in for megatron's AttnBackend.local enum member
        name = "local"

    with pytest.raises(ZeppelinArgsError, match="attention-backend local"):
        check_megatron_args(megatron_namespace(attention_backend=Local()), world_size=32, gpus_per_node=8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(world_size=12, gpus_per_node=8), "world size 12 is not a multiple of 8"),
        (dict(world_size=24, gpus_per_node=6, tensor_parallel=4), "does not divide the 6 GPUs"),
        (dict(world_size=16, gpus_per_node=8, global_batch_size=24, micro_batch_size=1),
         "--global-batch-size 24 is not a multiple"),
        (dict(world_size=16, gpus_per_node=8, seq_length=None), "--seq-length must be a positive integer"),
    ],
)
def test_parallel_shape_errors(kwargs: dict, match: str) -> None:
    full = dict(world_size=16, gpus_per_node=8, tensor_parallel=1, micro_batch_size=1, global_batch_size=32,
                seq_length=4096)
    full.update(kwargs)
    with pytest.raises(ZeppelinArgsError, match=match):
        ZeppelinParallel(**full)


def test_options_type_checked() -> None:
    with pytest.raises(ZeppelinArgsError, match="options is a dict, expected a PlannerOptions"):
        ZeppelinConfig(cluster="2x8", options={"remap": "on"})  # type: ignore[arg-type]

