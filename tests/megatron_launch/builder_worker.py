"""Builds the model the way a Megatron-LM checkout's pretrain() would, on CPU (gloo, 1 rank).

Usage: python builder_worker.py MEGATRON_LM REPO [--mcore-main-compat] [EXTRA_PATH ...]
Prints ``RESULT {...}``. Parses a tiny GPT's flags with the checkout's
``parse_and_validate_args`` (or ``parse_args`` + ``validate_args``), then builds:

* model-config convention (core_v0.19 on): Megatron's own ``GPTModelBuilder`` from the
  ``GPTModelConfig`` that ``use_zeppelin_model`` prepared, then the config's pre-wrap hooks,
  as ``setup_model_and_optimizer`` does;
* args / container conventions: ``zeppelin_gpt_builder(args)``, what ``model_provider`` calls.

Reports the builder used, how many core-attention modules are Zeppelin's and whether the
model was prepared (RoPE hook installed) - that is, that the Zeppelin spec reached the model.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def main() -> None:
    megatron_lm, repo, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    sys.path.insert(0, repo)
    sys.path.insert(1, megatron_lm)
    sys.path.extend(a for a in rest if a != "--mcore-main-compat")
    os.environ.update(WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("ZEPPELIN_TEST_PORT", "29613"), CUDA_DEVICE_MAX_CONNECTIONS="1")
    if "--mcore-main-compat" in rest:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import mcore_main_compat

        mcore_main_compat.install()
    import torch.distributed as dist
    from megatron.training import arguments as megatron_arguments
    from megatron.training import pretrain as megatron_pretrain

    from zeppelin_megatron.megatron import pretrain as zp
    from zeppelin_megatron.megatron.attention import ZeppelinCoreAttention
    from zeppelin_megatron.megatron.cpu_support import init_parallel_state, megatron_on_cpu

    argv = ["pretrain_gpt.py", "--zeppelin", "--zeppelin-cluster", "1x1", "--num-layers", "2", "--hidden-size", "64",
            "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--swiglu",
            "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--seq-length", "256",
            "--max-position-embeddings", "256", "--micro-batch-size", "1", "--global-batch-size", "1",
            "--train-iters", "1", "--lr", "1e-4", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
            "--data-path", "/data/corpus_text_document", "--eval-iters", "0", "--transformer-impl", "local",
            "--no-rope-fusion", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion",
            "--use-cpu-initialization", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
            "--no-masked-softmax-fusion", "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion"]
    sys.argv = zp.check_startup(argv)
    convention = zp.pretrain_convention(megatron_pretrain)
    if hasattr(megatron_arguments, "parse_and_validate_args"):
        args = megatron_arguments.parse_and_validate_args(extra_args_provider=zp.extra_args_provider(),
                                                          args_defaults=dict(zp.ARGS_DEFAULTS))
    else:  # core_v0.16 - v0.17: what initialize_megatron does
        from megatron.training.global_vars import set_global_variables

        args = megatron_arguments.parse_args(extra_args_provider=zp.extra_args_provider())
        megatron_arguments.validate_args(args, dict(zp.ARGS_DEFAULTS))
        set_global_variables(args)
    dist.init_process_group("gloo", rank=0, world_size=1)
    init_parallel_state(1)
    with megatron_on_cpu():
        if convention == "model-config":
            from megatron.core.process_groups_config import ProcessGroupCollection
            from megatron.training.argument_utils import gpt_config_from_args
            from megatron.training.models.base import compose_hooks

            model_cfg = zp.use_zeppelin_model(gpt_config_from_args(args))
            builder = model_cfg.get_builder_cls()(model_cfg)
            model = builder.build_model(ProcessGroupCollection.use_mpu_process_groups(), pre_process=True,
                                        post_process=True)
            model = compose_hooks(model_cfg.pre_wrap_hooks)([model])[0]
            built_by = f"{type(builder).__module__}.{type(builder).__name__}"
        else:
            model = zp.zeppelin_gpt_builder(args)
            built_by = "zeppelin_megatron.megatron.pretrain.zeppelin_gpt_builder"
    attention = [type(m.core_attention).__name__ for m in model.modules() if hasattr(m, "core_attention")]
    binding = getattr(model, "_zeppelin_binding", None)
    print("RESULT " + json.dumps({
        "convention": convention, "built_by": built_by, "model": type(model).__name__,
        "core_attention": attention, "zeppelin_attention": sum(isinstance(m, ZeppelinCoreAttention)
                                                              for m in model.modules()),
        "prepared": binding is not None, "rope_hooks": len(binding.rotary) if binding is not None else 0,
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
