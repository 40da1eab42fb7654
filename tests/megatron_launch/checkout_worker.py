"""Runs in a subprocess with a Megatron-LM checkout first on sys.path, as the launcher puts it.

Prints one JSON object (``RESULT {...}``).

Usage: python checkout_worker.py MEGATRON_LM REPO [--mcore-main-compat] [EXTRA_PATH ...].
Checks our flags and start-up checks against the checkout's real parser and
``validate_args`` (CPU flags: NullTokenizer, local transformer impl, no fusions),
and, where the checkout builds models from a ``GPTModelConfig`` (core_v0.19 on),
that the config Zeppelin hands to ``pretrain()`` carries its layer spec and hook.
``megatron`` is a namespace package: without a ``megatron/core`` in the checkout
(the test snapshots) megatron.core comes from the installed megatron-core.
EXTRA_PATH folders are appended to sys.path (stand-ins for files a snapshot lacks).
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def typical_argv(repo: str, **extra: str) -> list[str]:
    flags = {
        "--num-layers": "4", "--hidden-size": "512", "--num-attention-heads": "8",
        "--group-query-attention": None, "--num-query-groups": "4", "--swiglu": None,
        "--normalization": "RMSNorm", "--position-embedding-type": "rope", "--seq-length": "8192",
        "--max-position-embeddings": "8192", "--micro-batch-size": "1", "--global-batch-size": "64",
        "--tensor-model-parallel-size": "2", "--sequence-parallel": None, "--train-iters": "10",
        "--lr": "1e-4", "--bf16": None, "--tokenizer-type": "NullTokenizer", "--vocab-size": "32000",
        "--data-path": "/data/corpus_text_document", "--split": "100,0,0", "--eval-iters": "0",
        "--transformer-impl": "local", "--no-rope-fusion": None, "--no-persist-layer-norm": None,
        "--no-gradient-accumulation-fusion": None, "--untie-embeddings-and-output-weights": None,
        "--attention-dropout": "0.0",
        "--zeppelin": None, "--zeppelin-cluster": f"4x8@{repo}/configs/clusters/h100.yaml",
    }
    flags.update(extra)
    argv = ["pretrain_gpt.py"]
    for k, v in flags.items():
        if v == "__drop__":
            continue
        argv.append(k)
        if v is not None:
            argv.extend(v.split())
    return argv


def main() -> None:
    megatron_lm, repo, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    compat = "--mcore-main-compat" in rest
    # First, as the launcher does (megatron-core >= 0.19 ships part of megatron/training too).
    sys.path.insert(0, repo)
    sys.path.insert(1, megatron_lm)
    sys.path.extend(a for a in rest if a != "--mcore-main-compat")
    os.environ.update(WORLD_SIZE="32", LOCAL_WORLD_SIZE="8", RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    if compat:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import mcore_main_compat

        mcore_main_compat.install()
    import megatron.training.arguments as megatron_arguments
    from megatron.training.arguments import parse_args, validate_args

    # CPU accommodation (this worker only): validate_args asks the GPU's architecture when TP > 1.
    megatron_arguments.get_device_arch_version = lambda: 9  # Hopper

    from zeppelin_megatron.megatron.arguments import ZeppelinArgsError
    from zeppelin_megatron.megatron.planning import model_shape_from_args
    from zeppelin_megatron.megatron.pretrain import (
        check_startup,
        extra_args_provider,
        pretrain_convention,
        setup_from_args,
        use_zeppelin_model,
        zeppelin_spec_from_args,
    )

    import megatron.core
    import megatron.training

    out: dict = {"core_file": megatron.core.__file__ or str(list(megatron.core.__path__)),
                 "training_file": megatron.training.__file__,
                 "convention": pretrain_convention(megatron.training.pretrain)}
    env = dict(os.environ)
    argv = check_startup(typical_argv(repo), env=env, exit_on_error=False)
    out["prepared_tail"] = argv[-3:]
    # What Megatron does inside pretrain(): its parse_args with our provider, then its validate_args.
    sys.argv = argv
    args = parse_args(extra_args_provider=extra_args_provider(), ignore_unknown_args=False)
    raw_shape = model_shape_from_args(args)
    validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    setup = setup_from_args(args, world_size=args.world_size, local_world_size=8)
    out["megatron"] = {
        "world_size": args.world_size, "data_parallel_size": args.data_parallel_size,
        "calculate_per_token_loss": args.calculate_per_token_loss, "dataloader_type": args.dataloader_type,
        "zeppelin_routing": args.zeppelin_routing, "ffn_hidden_size": args.ffn_hidden_size,
    }
    out["setup"] = {
        "zeppelin_ranks": setup.parallel.zeppelin_ranks, "ranks_per_node": setup.cluster.gpus_per_node,
        "num_micro_batches": setup.parallel.num_micro_batches, "pad_to_multiple": setup.parallel.pad_to_multiple,
        "kv_heads": setup.model.kv_heads, "ffn": setup.model.ffn,
        "raw_shape_equals_validated": raw_shape == model_shape_from_args(args),
    }
    spec = zeppelin_spec_from_args(args)
    out["spec_core_attention"] = spec.submodules.self_attention.submodules.core_attention.__name__
    out["model_config"] = model_config_check(args, use_zeppelin_model) if out["convention"] == "model-config" else None
    sys.argv = argv + ["--no-zeppelin-routing", "--no-zeppelin-remap"]
    args2 = parse_args(extra_args_provider=extra_args_provider(), ignore_unknown_args=False)
    out["negation_parses"] = [args2.zeppelin_routing, args2.zeppelin_remap]

    errors = {
        "pp": ({"--pipeline-model-parallel-size": "2"}, {}),
        "cp": ({"--context-parallel-size": "2"}, {}),
        "hybrid_cp": ({"--hybrid-context-parallel": None}, {}),
        "cluster": ({}, {"WORLD_SIZE": "16"}),
        "profile": ({"--zeppelin-profile": "/nonexistent/profile.json"}, {}),
        "eval": ({"--eval-iters": "5"}, {}),
        "dataloader": ({"--dataloader-type": "cyclic"}, {}),
        "attention_backend": ({"--attention-backend": "local"}, {}),
        "attention_dropout": ({"--attention-dropout": "__drop__"}, {}),  # Megatron's default, 0.1
        "window": ({"--window-size": "(4096,0)"}, {}),
        "cuda_graph": ({"--cuda-graph-impl": "local"}, {}),
        "tp_comm_overlap": ({"--tp-comm-overlap": None}, {}),
        "full_validation": ({"--full-validation": None}, {}),
    }
    out["errors"] = {}
    for name, (flags, env_over) in errors.items():
        try:
            check_startup(typical_argv(repo, **flags), env={**env, **env_over}, exit_on_error=False)
            out["errors"][name] = None
        except ZeppelinArgsError as exc:
            out["errors"][name] = str(exc)
    out["recipe"] = recipe_check(repo, env, check_startup, parse_args, extra_args_provider, validate_args)
    out["batch_schedules"] = batch_schedule_check(repo, env, check_startup, parse_args, extra_args_provider,
                                                  validate_args, setup_from_args,
                                                  has_steps=hasattr(args, "step_batch_size_schedule"))
    # --fp8-format through Megatron's parser and validate_args: TE's FP8 GEMMs need rows in multiples of 16, so
    # every rank's rows are padded to 16 x TP 2 (sequence parallelism splits them over the TP ranks)
    fp8 = {"--fp8-format": "hybrid", "--transformer-impl": "transformer_engine"}
    sys.argv = check_startup(typical_argv(repo, **fp8), env=env, exit_on_error=False)
    args = parse_args(extra_args_provider=extra_args_provider(), ignore_unknown_args=False)
    validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    out["fp8_pad_to_multiple"] = setup_from_args(args, world_size=args.world_size, local_world_size=8
                                                 ).parallel.pad_to_multiple
    out["phase_consumed"] = None
    if hasattr(args, "phase_transition_iterations"):  # Megatron-LM 0.19 on
        from zeppelin_megatron.megatron.run_shape import train_data_consumed

        sys.argv = check_startup(typical_argv(repo, **{"--phase-transition-iterations": "8,4"}), env=env,
                                 exit_on_error=False)
        args = parse_args(extra_args_provider=extra_args_provider(), ignore_unknown_args=False)
        validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        args.iteration, args.consumed_train_samples = 6, 6 * args.global_batch_size  # as a checkpoint sets them
        out["phase_consumed"] = [args.phase_transition_iterations, train_data_consumed(args)]
    print("RESULT " + json.dumps(out))


def model_config_check(args, use_zeppelin_model) -> dict:
    """What the launcher hands pretrain() on the model-config path (core_v0.19 on): Megatron's own
    GPTModelConfig from these args, with Zeppelin's layer spec and pre-wrap hook, inside the container."""
    from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args

    def name(fn) -> str:
        return f"{fn.__module__}.{fn.__qualname__}"

    model_cfg = use_zeppelin_model(gpt_config_from_args(args))
    container = pretrain_cfg_container_from_args(args, model_cfg)
    return {"layer_spec": name(model_cfg.transformer_layer_spec),
            "pre_wrap_hooks": [name(h) for h in model_cfg.pre_wrap_hooks],
            "container_model_is_it": container.model is model_cfg}


def recipe_check(repo, env, check_startup, parse_args, extra_args_provider, validate_args) -> dict:
    """Source every configs/recipes/*.sh as the launchers do (4 nodes x 8 GPUs, a blend of two datasets as
    DATA_PREFIX), and smoke_gpt.sh with DATA_PREFIX=mock (as "smoke_gpt.sh mock", no TOKENIZER_MODEL); their
    flags must pass our start-up checks and Megatron's validate_args."""
    import glob
    import subprocess

    out = {}
    renv = dict(env, NNODES="4", GPUS_PER_NODE="8", DATA_PREFIX="0.3 /data/web_text_document 0.7 /data/code",
                TOKENIZER_MODEL="gpt2", CKPT_DIR="/tmp/ckpt")
    mock_env = {k: v for k, v in renv.items() if k != "TOKENIZER_MODEL"}
    runs = [(os.path.basename(p), p, renv) for p in sorted(glob.glob(f"{repo}/configs/recipes/*.sh"))]
    runs.append(("smoke_gpt.sh mock", f"{repo}/configs/recipes/smoke_gpt.sh", dict(mock_env, DATA_PREFIX="mock")))
    for key, path, renv in runs:
        r = subprocess.run(["bash", "-c", 'source "$0" && printf "%s\\0" "${RECIPE_ARGS[@]}"', path],
                           env=renv, capture_output=True, text=True, check=True)
        flags = [a for a in r.stdout.split("\0") if a]
        argv = check_startup(["pretrain_gpt.py", *flags], env=renv, exit_on_error=False)
        sys.argv = argv
        args = parse_args(extra_args_provider=extra_args_provider(), ignore_unknown_args=False)
        validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        out[key] = {
            "cluster": args.zeppelin_cluster, "global_batch_size": args.global_batch_size,
            "data_parallel_size": args.data_parallel_size, "seq_length": args.seq_length,
            "tensor_parallel": args.tensor_model_parallel_size, "num_layers": args.num_layers,
            "data_path": list(args.data_path or []), "mock_data": bool(args.mock_data),
            "tokenizer_type": args.tokenizer_type}
    return out

def batch_schedule_check(repo, env, check_startup, parse_args, extra_args_provider, validate_args, setup_from_args,
                         *, has_steps: bool) -> dict:
    """Micro-steps per step, 12 steps of sample-based training, as Megatron's own calculator counts them (set up by
    the checkout's set_global_variables from the validated args, driven as its training loop drives it) and as
    Zeppelin's schedule does: --rampup-batch-size 32 32 64 (Megatron-LM up to 0.18 ramps, 0.19 on ignores it) and,
    where the parser has it, --step-batch-size-schedule (thresholds in tokens: 1M // 8192 = 122 samples)."""
    from megatron.core.num_microbatches_calculator import (
        get_num_microbatches,
        unset_num_microbatches_calculator,
        update_num_microbatches,
    )
    from megatron.training.global_vars import destroy_global_vars, set_global_variables

    cases = {"rampup": {"--rampup-batch-size": "32 32 64"}}
    if has_steps:
        cases["steps"] = {"--global-batch-size": "__drop__", "--step-batch-size-schedule": "0:32,1M:64,3M:128"}
    out = {}
    for name, flags in cases.items():
        argv = check_startup(typical_argv(repo, **{"--train-iters": "__drop__", "--train-samples": "2000", **flags}),
                             env=env, exit_on_error=False)
        sys.argv = argv
        args = parse_args(extra_args_provider=extra_args_provider(), ignore_unknown_args=False)
        validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        setup = setup_from_args(args, world_size=args.world_size, local_world_size=8)
        set_global_variables(args, build_tokenizer=False)
        consumed, megatron_counts = 0, []
        for _ in range(12):
            update_num_microbatches(consumed, consistency_check=True)
            megatron_counts.append(get_num_microbatches())
            consumed += megatron_counts[-1] * args.micro_batch_size * args.data_parallel_size
        destroy_global_vars()
        unset_num_microbatches_calculator()  # destroy_global_vars leaves it set in some versions
        schedule = setup.parallel.schedule
        out[name] = {"megatron_counts": megatron_counts, "describe": setup.describe(),
                     "schedule_counts": [schedule.locate(m)[2] for m in range(sum(megatron_counts))
                                         if schedule.locate(m)[1] == 0]}
    return out


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
