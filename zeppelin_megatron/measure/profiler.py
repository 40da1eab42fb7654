"""Measure a ``zeppelin-profile/1`` cost profile on the local device.

What is measured (all forward + backward, one layer, median of ``repeats``
timings after ``warmup`` untimed runs; CUDA events on GPU, ``perf_counter``
on CPU):

* ``attention.rows``: one causal varlen call of ``num_seqs = max(1,
  tokens_per_call // s)`` sequences of ``s`` tokens, for each ``s`` in
  ``lengths``, through the chosen kernel backend;
* ``ring_blocks.rows``: non-causal ``s x s/2`` and ``s/2 x s`` blocks (the
  shapes zigzag ring steps make), ``max(1, tokens_per_call // (2 s))``
  blocks per call;
* ``linear.rows``: the layer's four GEMMs (:mod:`.linear`) for ``t`` tokens,
  for each ``t`` in ``linear_tokens``;
* ``call_overhead_ms``: one 16-token causal call, timed by wall clock with a
  device synchronisation (host-side launch cost included);
* ``hbm``: device-memory bandwidth from one large device-to-device copy
  (``hbm_bytes``: 1 GiB on a GPU, 64 MiB on CPU), ``2 * bytes / time`` (read +
  write, the convention of the bundled H100 figure), labelled ``measured``.

Links are measured separately (:mod:`.links`, only under ``torchrun``) and
passed in; without them the profile has no ``links`` section and the planner
keeps the cluster file's nominal bandwidths (said in ``notes``).
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..planner.model import ModelShape
from ..planner.profile import PROFILE_SCHEMA, parse_profile
from ..runtime.kernels import VarlenBatch
from .attention import AttentionWork, KernelCall
from .linear import LinearWork, linear_flops
from .links import LinkResult
from .timing import kernel_for, time_ms

__all__ = ["ProfileOptions", "measure_profile", "measure_hbm_GBps",
           "GPU_LENGTHS", "GPU_LINEAR_TOKENS", "GPU_TOKENS_PER_CALL"]

GPU_LENGTHS: tuple[int, ...] = tuple(2 ** k for k in range(7, 18))  # 128 .. 131072, as the bundled profile
GPU_LINEAR_TOKENS: tuple[int, ...] = (1024, 4096, 16384, 65536)
GPU_TOKENS_PER_CALL = 131072
OVERHEAD_TOKENS = 16


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """What to measure. ``model`` gives the attention heads/head_dim and the linear layer's shape."""

    model: ModelShape
    lengths: tuple[int, ...]
    linear_tokens: tuple[int, ...]
    tokens_per_call: int
    dtype: torch.dtype
    dtype_name: str
    device: torch.device
    backend: str | None = None
    warmup: int = 3
    repeats: int = 10
    blocks: bool = True
    seed: int = 0
    hbm_bytes: int | None = None
    """Bytes of the timed copy for ``hbm`` (None: 1 GiB on CUDA, 64 MiB elsewhere)."""

    def __post_init__(self) -> None:
        for name in ("lengths", "linear_tokens"):
            values = tuple(getattr(self, name))
            object.__setattr__(self, name, values)
            if not values:
                raise ValueError(f"{name} must not be empty")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"{name}: {v!r} is not a positive integer")
            for a, b in zip(values, values[1:]):
                if b <= a:
                    raise ValueError(f"{name} must be strictly increasing, got {a} then {b}")
        if self.blocks and min(self.lengths) < 2:
            raise ValueError(f"ring blocks need lengths >= 2 (s x s/2 blocks), got {min(self.lengths)}")
        if self.hbm_bytes is not None and (isinstance(self.hbm_bytes, bool) or not isinstance(self.hbm_bytes, int)
                                           or self.hbm_bytes < 1024):
            raise ValueError(f"hbm_bytes must be an integer >= 1024, got {self.hbm_bytes!r}")
        if self.tokens_per_call < 1:
            raise ValueError(f"tokens_per_call must be >= 1, got {self.tokens_per_call}")
        if self.warmup < 0 or self.repeats < 1:
            raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={self.warmup}, repeats={self.repeats}")


def _sig(x: float) -> float:
    """Five significant digits (a fixed number of decimals would round a fast row to 0)."""
    return float(f"{x:.5g}")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def measure_profile(
    opts: ProfileOptions,
    *,
    links: LinkResult | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure and return the profile document (already validated by :func:`parse_profile`)."""
    say = progress or (lambda _msg: None)
    dev, m = opts.device, opts.model
    kernel = kernel_for(opts.backend, dev, opts.dtype)
    hq, hkv, d = m.q_heads, m.kv_heads, m.head_dim

    def attention_ms(lens_q: tuple[int, ...], lens_k: tuple[int, ...], causal: bool) -> float:
        batch = VarlenBatch(lens_q=lens_q, lens_k=lens_k, causal=causal, device=dev)
        call = KernelCall(queue=0, kind="profile", step=0, batch=batch, q_heads=hq, kv_heads=hkv)
        work = AttentionWork([call], head_dim=d, kernel=kernel, dtype=opts.dtype, device=dev, seed=opts.seed)
        return time_ms(work.run, device=dev, warmup=opts.warmup, repeats=opts.repeats).median

    def tflops(q_len: int, k_len: int, n: int, causal: bool, ms: float) -> float:
        """Achieved rate, counting forward+backward as 3.5x forward and causal as half the area."""
        area = q_len * k_len / (2 if causal else 1)
        return float(f"{3.5 * 4 * area * hq * d * n / (ms * 1e-3) / 1e12:.4g}")

    att_rows = []
    for s in opts.lengths:
        n = max(1, opts.tokens_per_call // s)
        ms = attention_ms((s,) * n, (s,) * n, True)
        rate = tflops(s, s, n, True, ms)
        att_rows.append({"seqlen": s, "num_seqs": n, "causal": True, "fwd_bwd_ms": _sig(ms),
                         "fwd_bwd_tflops": rate})
        say(f"attention causal s={s} x{n}: {ms:.4f} ms ({rate} TFLOP/s)")

    block_rows = []
    if opts.blocks:
        for s in opts.lengths:
            n = max(1, opts.tokens_per_call // (2 * s))
            for q_len, k_len in ((s, s // 2), (s // 2, s)):
                ms = attention_ms((q_len,) * n, (k_len,) * n, False)
                rate = tflops(q_len, k_len, n, False, ms)
                block_rows.append({"q_len": q_len, "k_len": k_len, "num_seqs": n, "fwd_bwd_ms": _sig(ms),
                                   "fwd_bwd_tflops": rate})
                say(f"ring block {q_len}x{k_len} x{n}: {ms:.4f} ms ({rate} TFLOP/s)")

    lin_rows = []
    for t in opts.linear_tokens:
        work = LinearWork(m, t, dtype=opts.dtype, device=dev, seed=opts.seed)
        ms = time_ms(work.run, device=dev, warmup=opts.warmup, repeats=opts.repeats).median
        rate = float(f"{linear_flops(m, t) / (ms * 1e-3) / 1e12:.4g}")
        lin_rows.append({"tokens": t, "fwd_bwd_ms": _sig(ms), "tflops": rate})
        say(f"linear t={t}: {ms:.4f} ms ({rate} TFLOP/s)")
        del work

    batch = VarlenBatch(lens_q=(OVERHEAD_TOKENS,), lens_k=(OVERHEAD_TOKENS,), causal=True, device=dev)
    tiny = AttentionWork([KernelCall(queue=0, kind="profile", step=0, batch=batch, q_heads=hq, kv_heads=hkv)],
                         head_dim=d, kernel=kernel, dtype=opts.dtype, device=dev, seed=opts.seed)
    overhead = time_ms(tiny.run, device=dev, warmup=opts.warmup, repeats=opts.repeats, wall=True).median
    say(f"call overhead ({OVERHEAD_TOKENS}-token causal call, wall clock): {overhead:.4f} ms")

    hbm_GBps, hbm_bytes = measure_hbm_GBps(opts)
    say(f"HBM bandwidth ({hbm_bytes / 2**20:.0f} MiB device-to-device copy, read + write): {hbm_GBps:.1f} GB/s")

    timing = "CUDA events" if dev.type == "cuda" else "time.perf_counter"
    notes = [
        f"Measured by `zeppelin profile` on {_device_name(dev)} ({dev}), dtype {opts.dtype_name}, "
        f"attention backend {kernel.name!r}: median of {opts.repeats} timings after {opts.warmup} warm-up runs "
        f"({timing}); forward + backward of one layer.",
        f"Attention: q_heads={hq}, kv_heads={hkv}, head_dim={d}; one varlen call per row "
        f"(~{opts.tokens_per_call} tokens per call).",
        f"Linear: the QKV, output-projection, gate+up and down GEMMs (forward + backward, GEMMs only) of a layer "
        f"with hidden={m.hidden}, ffn={m.ffn}.",
        f"call_overhead_ms: one {OVERHEAD_TOKENS}-token causal call, wall clock with device synchronisation.",
    ]
    doc: dict[str, Any] = {
        "schema": PROFILE_SCHEMA,
        "device": _device_name(dev),
        "dtype": opts.dtype_name,
        "attention": {"q_heads": hq, "kv_heads": hkv, "head_dim": d, "rows": att_rows},
        "linear": {"hidden": m.hidden, "ffn": m.ffn, "q_heads": hq, "kv_heads": hkv, "head_dim": d,
                   "rows": lin_rows},
        "call_overhead_ms": _sig(overhead),
        "hbm": {"GBps": _sig(hbm_GBps), "source": "measured",
                "note": f"one {hbm_bytes} B device-to-device copy, bytes read + written per second"},
        "software": {"torch": torch.__version__, "python": platform.python_version(),
                     "cuda": torch.version.cuda, "platform": sys.platform},
        "measurement": {"backend": kernel.name, "warmup": opts.warmup, "repeats": opts.repeats,
                        "statistic": "median", "timer": timing, "tokens_per_call": opts.tokens_per_call,
                        "cpu_threads": torch.get_num_threads()},
    }
    if block_rows:
        doc["ring_blocks"] = {"q_heads": hq, "kv_heads": hkv, "head_dim": d, "rows": block_rows}
    if links is not None and links.measured:
        doc["links"] = links.profile_links()
        doc["links_measured"] = links.to_dict()
        notes.append(links.summary())
    else:
        notes.append(
            "Links NOT measured (single process): no 'links' section, so the planner keeps the cluster file's "
            "nominal NVLink/NIC bandwidths. Run under torchrun with several GPUs (and 2 nodes for the NIC) "
            "to measure them.")
    doc["notes"] = notes
    doc["source"] = " ".join(notes)
    parse_profile(doc, source="measured profile")  # the planner must accept what we write
    return doc


def measure_hbm_GBps(opts: ProfileOptions) -> tuple[float, int]:
    """``(GB/s, bytes copied)``: median time of ``dst.copy_(src)`` over ``opts.hbm_bytes`` bytes,
    counted as ``2 * bytes`` (read + write) per second. Example: 1 GiB copied in 0.727 ms -> 2954 GB/s."""
    dev = opts.device
    n = opts.hbm_bytes if opts.hbm_bytes is not None else (2**30 if dev.type == "cuda" else 64 * 2**20)
    src = torch.ones(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device=dev, warmup=max(opts.warmup, 1), repeats=opts.repeats).median
    return 2 * n / (ms * 1e-3) / 1e9, n
