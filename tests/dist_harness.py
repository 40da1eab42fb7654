"""Spawn gloo process groups on CPU for runtime tests (one spawn runs many checks)."""

from __future__ import annotations

import os
import socket
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A deadlock shows up as a gloo timeout error instead of a hung test run.
TIMEOUT = timedelta(seconds=90)


def _entry(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=TIMEOUT,
    )
    try:
        fn(rank, world, *args)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def spawn(world: int, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` gloo ranks; re-raises the first failure."""
    mp.spawn(_entry, args=(world, _free_port(), fn, args), nprocs=world, join=True)
