"""Measurement on real hardware: cost profiles (``zeppelin profile``) and plan replay (``zeppelin replay``).

Imports torch and the runtime's kernel backends; never Megatron.

* :mod:`.timing`: warm-up + repeated timings + median (CUDA events / perf_counter).
* :mod:`.attention`: kernel calls (:class:`KernelCall`) run forward then backward on random inputs.
* :mod:`.linear`: one Llama-style layer's GEMMs, forward + backward.
* :mod:`.links`: point-to-point bandwidth/latency under torch.distributed.
* :mod:`.profiler`: the ``zeppelin-profile/1`` document.
* :mod:`.workload`: a rank's kernel calls for a plan, from the runtime engine's program.
* :mod:`.replay`, :mod:`.report`: per-rank replay and its tables.
"""

from .attention import AttentionWork, KernelCall, call_pairs, causal_pairs
from .linear import LinearWork, gemm_shapes, linear_flops
from .links import LinkResult, measure_links
from .profiler import ProfileOptions, measure_profile
from .replay import RankReplay, ReplayResult, replay_plan
from .report import format_comparison, format_replay
from .timing import Timing, parse_dtype, resolve_device, time_ms
from .workload import RankWork, rank_work

__all__ = [
    "AttentionWork", "KernelCall", "LinearWork", "LinkResult", "ProfileOptions", "RankReplay", "RankWork",
    "ReplayResult", "Timing", "call_pairs", "causal_pairs", "format_comparison", "format_replay", "gemm_shapes",
    "linear_flops", "measure_links", "measure_profile", "parse_dtype", "rank_work", "replay_plan",
    "resolve_device", "time_ms",
]
