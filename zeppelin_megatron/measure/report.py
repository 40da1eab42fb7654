"""Text tables for replay results (measured vs predicted, per rank and across strategies)."""

from __future__ import annotations

from typing import Sequence

from .replay import COMM_NOTE, IdealResult, ReplayResult

__all__ = ["format_replay", "format_comparison"]


def _f(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.0f}%"


def format_replay(res: ReplayResult, gpus_per_node: int) -> str:
    """Per-rank table of one strategy: MEASURED ms next to PREDICTED ms (cost model), one layer fwd+bwd."""
    s = res.summary()
    balance = s["total"]["perfect_balance_ms"]
    head = (f"{'rank':>4} {'node':>4} {'calls':>5} {'att tok':>8} {'lin tok':>8} | {'attn meas':>9} "
            f"{'attn pred':>9} {'err':>5} | {'lin meas':>9} {'lin pred':>9} {'err':>5} | {'total':>9} {'/bal':>5}")
    lines = [
        f"== {res.strategy} (attention_comm={res.attention_comm}){': ' + res.note if res.note else ''}",
        f"   measured: one layer, forward+backward, ms, median of {res.repeats} after {res.warmup} warm-up "
        f"({res.timer}), backend {res.backend} on {res.device}, {res.dtype}",
        f"   predicted: cost model (plan.predicted / {res.layers} layers)",
        head, "-" * len(head),
    ]
    for r in res.ranks:
        lines.append(
            f"{r.rank:>4} {r.rank // gpus_per_node:>4} {r.calls:>5} {r.attention_tokens:>8} {r.linear_tokens:>8} | "
            f"{r.attention_ms:>9.3f} {_f(r.predicted_attention_ms):>9} {_pct(r.error('attention')):>5} | "
            f"{r.linear_ms:>9.3f} {_f(r.predicted_linear_ms):>9} {_pct(r.error('linear')):>5} | "
            f"{r.total_ms:>9.3f} {r.total_ms / balance if balance else 1.0:>5.2f}")
    for what in ("attention", "total"):
        st = s[what]
        lines.append(
            f"{what} (measured): slowest rank {st['slowest_rank']} {st['max_ms']:.3f} ms, mean {st['mean_ms']:.3f} ms "
            f"= perfect balance (sum/ranks), max/mean {st['max_over_mean']:.3f}; predicted slowest "
            f"{_f(st['predicted_max_ms'])} ms; per-rank prediction error mean |e| "
            f"{_pct(st['prediction_error_mean_abs'])}, max |e| {_pct(st['prediction_error_max_abs'])}")
    lines.append(f"note: {COMM_NOTE}")
    return "\n".join(lines)


def format_comparison(results: Sequence[ReplayResult], ideal: IdealResult | None = None) -> str:
    """One line per strategy: measured slowest rank and balance, predicted slowest rank; then the ideal."""
    head = (f"{'strategy':<14} {'attn max ms':>11} {'attn max/mean':>13} {'total max ms':>12} "
            f"{'total max/mean':>14} {'pred total max':>14} {'pred |err|':>10}")
    lines = ["== comparison (measured compute per layer; communication not replayed)", head, "-" * len(head)]
    for res in results:
        s = res.summary()
        a, t = s["attention"], s["total"]
        lines.append(
            f"{res.strategy:<14} {a['max_ms']:>11.3f} {a['max_over_mean']:>13.3f} {t['max_ms']:>12.3f} "
            f"{t['max_over_mean']:>14.3f} {_f(t['predicted_max_ms']):>14} {_pct(t['prediction_error_mean_abs']):>10}")
    if ideal is not None:
        lines.append(
            f"{'whole/ranks':<14} {ideal.attention_ms:>11.3f} {1.0:>13.3f} {ideal.total_ms:>12.3f} {1.0:>14.3f} "
            f"{'-':>14} {'-':>10}")
        lines.append(f"whole/ranks (measured, --ideal): every sequence whole ({ideal.calls} calls of <= "
                     f"{ideal.tokens_per_call} tokens), attention total / {ideal.ranks} ranks, plus the GEMMs of a "
                     "perfectly token-balanced rank; no splitting cost, so with kernels that skip masked tiles "
                     "(flash) it is the balance target, not with the reference kernel (full L x L scores)")
    return "\n".join(lines)
