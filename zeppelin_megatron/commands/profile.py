"""``zeppelin profile``: measure a cost profile (``zeppelin-profile/1``) on this machine.

Single process: attention and linear tables on one device; links are not
measured (the planner keeps the cluster file's nominal bandwidths; the JSON
says so). Under ``torchrun`` with world size > 1 every rank first times
point-to-point links (NCCL on GPUs), then rank 0 times the kernels and writes
the file.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

__all__ = ["HELP", "add_arguments", "run", "parse_int_list", "model_from_args", "apply_threads"]

HELP = "measure the attention/linear/link cost profile of this machine and write its JSON"

QUICK_CPU_LENGTHS: tuple[int, ...] = (64, 128, 256)
QUICK_CPU_LINEAR: tuple[int, ...] = (64, 256)
QUICK_GPU_LENGTHS: tuple[int, ...] = tuple(2 ** k for k in range(7, 15))  # 128 .. 16384
QUICK_GPU_LINEAR: tuple[int, ...] = (1024, 4096)


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """``"64,128,256"`` -> ``(64, 128, 256)``; every item a positive integer."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"{what}: {item!r} is not an integer") from None
        if value < 1:
            raise ValueError(f"{what}: {value} must be >= 1")
        out.append(value)
    if not out:
        raise ValueError(f"{what}: no values in {text!r}")
    return tuple(out)


def add_threads_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None,
                   help="CPU intra-op threads for torch (default: torch's choice); 1 gives steadier CPU timings "
                        "on a busy machine")


def apply_threads(threads: int | None) -> None:
    """Set torch's intra-op thread count (``None``: leave it)."""
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model YAML (configs/models/); default: Llama-7B shape")
    p.add_argument("--heads", type=int, default=None, help="query heads (overrides the model)")
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (default: --heads when that is given)")
    p.add_argument("--head-dim", type=int, default=None, help="head dimension")
    p.add_argument("--hidden", type=int, default=None,
                   help="hidden size (default with --heads and no --model: heads x head_dim)")
    p.add_argument("--ffn", type=int, default=None, help="MLP width (default with --heads and no --model: 4 x hidden)")


def model_from_args(args: argparse.Namespace):  # -> ModelShape
    """The model YAML (or Llama-7B), with explicit shape flags applied on top.

    Without ``--model``, ``--heads`` describes a small model from scratch:
    ``kv_heads = heads``, ``hidden = heads * head_dim``, ``ffn = 4 * hidden``
    unless given (e.g. ``--heads 2 --head-dim 16`` -> hidden 32, ffn 128).
    """
    from ..planner import ModelShape, load_model

    base = load_model(args.model)
    if args.model is None and args.heads is not None:
        head_dim = args.head_dim if args.head_dim is not None else base.head_dim
        hidden = args.hidden if args.hidden is not None else args.heads * head_dim
        return ModelShape(name="custom", layers=base.layers, hidden=hidden, q_heads=args.heads,
                          kv_heads=args.kv_heads if args.kv_heads is not None else args.heads,
                          ffn=args.ffn if args.ffn is not None else 4 * hidden, head_dim=head_dim)
    changes = {k: v for k, v in (("q_heads", args.heads), ("kv_heads", args.kv_heads), ("head_dim", args.head_dim),
                                 ("hidden", args.hidden), ("ffn", args.ffn)) if v is not None}
    return replace(base, **changes) if changes else base


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="write the zeppelin-profile/1 JSON here")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA when available)")
    p.add_argument("--dtype", default=None, help="bf16 | fp16 | float32 | float64 (default: bf16 on CUDA, "
                                                 "float32 on CPU)")
    p.add_argument("--backend", default=None,
                   help="attention backend: reference | torch_varlen | flash_attn | te (default: best usable)")
    p.add_argument("--lengths", default=None,
                   help="comma-separated sequence lengths for the attention table (default: 128..131072 on "
                        "CUDA, 64,128,256 on CPU)")
    p.add_argument("--linear-tokens", default=None,
                   help="comma-separated token counts for the linear table (default: 1024,4096,16384,65536 on "
                        "CUDA, the --lengths values on CPU)")
    p.add_argument("--tokens-per-call", type=int, default=None,
                   help="tokens per attention call: num_seqs = tokens // length (default: 131072 on CUDA, "
                        "the longest length on CPU)")
    add_model_arguments(p)
    add_threads_argument(p)
    p.add_argument("--quick", action="store_true",
                   help="a rough profile in about a minute: 3 repeats after 1 warm-up, no ring_blocks table, and "
                        f"fewer rows (CPU: lengths {','.join(map(str, QUICK_CPU_LENGTHS))}, linear tokens "
                        f"{','.join(map(str, QUICK_CPU_LINEAR))}; CUDA: lengths {QUICK_GPU_LENGTHS[0]}.."
                        f"{QUICK_GPU_LENGTHS[-1]}); explicit flags win")
    p.add_argument("--repeats", type=int, default=None, help="timed repetitions per row, median kept (default 10; "
                                                             "3 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs before timing (default 3; 1 with --quick)")
    p.add_argument("--no-blocks", action="store_true", help="skip the ring_blocks table")
    p.add_argument("--link-bytes", type=int, default=64 << 20, help="message size for link bandwidth (torchrun)")
    p.add_argument("--link-iters", type=int, default=10, help="messages per bandwidth timing (torchrun)")
    p.add_argument("--quiet", action="store_true", help="no per-row progress lines")


def _distributed_env() -> tuple[int, int, int, int]:
    """(rank, world, local_rank, local_world) from torchrun's environment; (0, 1, 0, 1) without it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0, 1
    return (int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))


def run(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from ..measure.links import measure_links
    from ..measure.profiler import GPU_LENGTHS, GPU_LINEAR_TOKENS, GPU_TOKENS_PER_CALL, ProfileOptions, measure_profile
    from ..measure.timing import kernel_for, parse_dtype, resolve_device

    from .checks import check_input_file, check_output_file

    check_output_file(args.out, "--out")
    check_input_file(args.model, "--model")
    apply_threads(args.threads)
    rank, world, local_rank, local_world = _distributed_env()
    if world > 1 and torch.cuda.is_available() and args.device in ("auto", "cuda"):
        torch.cuda.set_device(local_rank)
    device = resolve_device(args.device)
    dtype, dtype_name = parse_dtype(args.dtype, device)
    model = model_from_args(args)
    on_gpu = device.type == "cuda"
    quick = args.quick
    default_lengths = (QUICK_GPU_LENGTHS if quick else GPU_LENGTHS) if on_gpu else QUICK_CPU_LENGTHS
    lengths = parse_int_list(args.lengths, "--lengths") if args.lengths else default_lengths
    default_linear = ((QUICK_GPU_LINEAR if quick else GPU_LINEAR_TOKENS) if on_gpu
                      else (QUICK_CPU_LINEAR if quick else lengths))
    lin_tokens = parse_int_list(args.linear_tokens, "--linear-tokens") if args.linear_tokens else default_linear
    per_call = args.tokens_per_call if args.tokens_per_call is not None else (
        GPU_TOKENS_PER_CALL if on_gpu else max(lengths))
    repeats = args.repeats if args.repeats is not None else (3 if quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if quick else 3)
    opts = ProfileOptions(model=model, lengths=lengths, linear_tokens=lin_tokens, tokens_per_call=per_call,
                          dtype=dtype, dtype_name=dtype_name, device=device, backend=args.backend,
                          warmup=warmup, repeats=repeats, blocks=not (args.no_blocks or quick))

    kernel_for(args.backend, device, dtype)  # an unusable backend fails now, not after the link timings
    links = None
    if world > 1:
        dist.init_process_group("nccl" if on_gpu else "gloo")
        try:
            links = measure_links(device=device, gpus_per_node=local_world, nbytes=args.link_bytes,
                                  iters=args.link_iters)
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return 0
        print(links.summary())
    else:
        print("single process: links not measured (the planner keeps the cluster's nominal bandwidths)")

    doc = measure_profile(opts, links=links, progress=None if args.quiet else print)
    out = Path(args.out)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({doc['device']}, {dtype_name}, backend {doc['measurement']['backend']}; MEASURED on this "
          f"machine)")
    return 0
