#!/usr/bin/env python
"""Megatron-LM's pretrain_gpt.py with Zeppelin's parts swapped in.

Usage (one process per GPU, e.g. under torchrun; see scripts/single_node.sh):

    python scripts/pretrain_gpt_zeppelin.py --megatron-lm /path/to/Megatron-LM \\
        --zeppelin --zeppelin-cluster 4x8@configs/clusters/h100.yaml <Megatron flags>

``--megatron-lm PATH`` (or the ``MEGATRON_LM`` environment variable) names a
Megatron-LM checkout: core_v0.16.x, core_v0.17.x, core_v0.18.x, core_v0.19.x
or main (see patches/README.md). It is put first on ``sys.path`` so
``pretrain_gpt``, ``model_provider`` and ``megatron.training`` come from it.
The script imports that ``pretrain_gpt`` and hands it to
``zeppelin_megatron.megatron.pretrain.run_pretrain_gpt``, which

1. checks the command line (``check_startup``): a configuration Zeppelin cannot
   serve stops here with exit code 2, before torch.distributed starts;
2. calls the checkout's ``pretrain`` the way that version expects (arguments
   parsed inside it up to core_v0.17; parsed first and passed in a config
   container from core_v0.18; from core_v0.19 the container's GPTModelConfig
   carries Zeppelin's layer spec) with Zeppelin's datasets provider, model
   builder / layer spec and forward step, keeping pretrain_gpt's in-process
   restart wrapper, embedding-rank function and ModelOpt flags.

A patched ``pretrain_gpt.py`` (patches/pretrain_gpt.patch) runs the same function.
"""

from __future__ import annotations

import time

_PROGRAM_START_TIME = time.time()

import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


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
                         "checkout (core_v0.16 - core_v0.19 or main)")
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

    from zeppelin_megatron.megatron.pretrain import run_pretrain_gpt

    run_pretrain_gpt(pretrain_gpt, argv, program_start=_PROGRAM_START_TIME)


if __name__ == "__main__":
    main(sys.argv)
