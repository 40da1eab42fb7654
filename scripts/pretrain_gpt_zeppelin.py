#!/usr/bin/env python
"""Megatron-LM's pretrain_gpt.py with Zeppelin's parts swapped in.

Usage (one process per GPU, e.g. under torchrun; see scripts/single_node.sh):

    python scripts/pretrain_gpt_zeppelin.py --megatron-lm /path/to/Megatron-LM \\
        --zeppelin --zeppelin-cluster 4x8@configs/clusters/h100.yaml <Megatron flags>

``--megatron-lm PATH`` (or the ``MEGATRON_LM`` environment variable) names a
Megatron-LM checkout (tag core_v0.16.1, see patches/README.md); it is put first
on ``sys.path`` so ``pretrain_gpt``, ``model_provider`` and ``megatron.training``
come from it. The script then:

1. checks the command line (``check_startup``): a configuration Zeppelin cannot
   serve stops here with exit code 2, before torch.distributed starts;
2. imports ``pretrain_gpt`` and calls its ``pretrain`` with Zeppelin's datasets
   provider, ``partial(model_provider, zeppelin_gpt_builder)``, Zeppelin's
   forward step and our ``extra_args_provider`` (ModelOpt's too when installed),
   keeping pretrain_gpt's ``args_defaults``, in-process restart wrapper and
   embedding-rank function.
"""

from __future__ import annotations

import time

_PROGRAM_START_TIME = time.time()

import os  # noqa: E402
import sys  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

ARGS_DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}  # as pretrain_gpt.py at core_v0.16.1


def split_megatron_lm(argv: list[str], env_value: str | None) -> tuple[str, list[str]]:
    """``(checkout path, argv without --megatron-lm PATH)``; the flag wins over ``MEGATRON_LM``."""
    out, path = [argv[0]], env_value
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--megatron-lm":
            if i + 1 >= len(argv):
                raise SystemExit("pretrain_gpt_zeppelin.py: --megatron-lm needs a path")
            path = argv[i + 1]
            i += 2
            continue
        if a.startswith("--megatron-lm="):
            path = a.split("=", 1)[1]
        else:
            out.append(a)
        i += 1
    if not path:
        raise SystemExit("pretrain_gpt_zeppelin.py: give --megatron-lm PATH or set MEGATRON_LM to a Megatron-LM "
                         "checkout (tag core_v0.16.1)")
    if not (Path(path) / "pretrain_gpt.py").is_file():
        raise SystemExit(f"pretrain_gpt_zeppelin.py: {path} has no pretrain_gpt.py; is it a Megatron-LM checkout?")
    return str(Path(path).resolve()), out


def main(argv: list[str]) -> None:
    megatron_lm, argv = split_megatron_lm(argv, os.environ.get("MEGATRON_LM"))
    sys.path.insert(0, megatron_lm)
    from zeppelin_megatron.megatron.arguments import zeppelin_requested  # no Megatron import

    if not zeppelin_requested(argv):
        raise SystemExit("pretrain_gpt_zeppelin.py runs Zeppelin: add --zeppelin "
                         "(or run Megatron-LM's pretrain_gpt.py)")

    import pretrain_gpt  # Megatron-LM's module: torch, megatron.training, model_provider, gpt_builder
    from megatron.core.enums import ModelType

    from zeppelin_megatron.megatron import pretrain as zeppelin

    modelopt = pretrain_gpt.add_modelopt_args if pretrain_gpt.has_nvidia_modelopt else None
    sys.argv = zeppelin.check_startup(argv, other_args_provider=modelopt)  # exits 2 on an unservable config

    pretrain_gpt.set_startup_timestamps(program_start=_PROGRAM_START_TIME, main_entry=time.time())
    pretrain, store = pretrain_gpt.inprocess_restart.maybe_wrap_for_inprocess_restart(pretrain_gpt.pretrain)
    pretrain(
        zeppelin.train_valid_test_datasets_provider,
        partial(pretrain_gpt.model_provider, zeppelin.zeppelin_gpt_builder),
        ModelType.encoder_or_decoder,
        zeppelin.forward_step,
        args_defaults=ARGS_DEFAULTS,
        extra_args_provider=zeppelin.extra_args_provider(modelopt),
        store=store,
        get_embedding_ranks=pretrain_gpt.get_embedding_ranks,
    )


if __name__ == "__main__":
    main(sys.argv)
