"""Blends: several indexed datasets trained in proportion to weights, as Megatron's ``--data-path W1 P1 W2 P2``.

Megatron's blend (megatron-core's ``BlendedDataset``) interleaves fixed-length samples of its datasets so that each
makes up its weight's share of the samples, so of the *tokens* trained; without weights (``--data-path P1 P2``) the
weights are the datasets' sizes. Zeppelin keeps documents whole, so here a weight is a share of the tokens too, and
no document is split or padded to meet it.

**Order** (:func:`blend_order`). Dataset ``i`` (``n_i`` sequences of ``T_i`` tokens in all, weight ``w_i``, the weights
normalised to sum to 1) runs through its own epochs one after another, its epoch ``q`` in the order
``np.random.default_rng([seed, q, i]).permutation(n_i)``; a sequence's *start* is the tokens of dataset ``i`` before it
in that stream. The blend visits every sequence at the *virtual time* ``start / w_i`` (compared in float64; ties: the
lower dataset index), so by virtual time ``t`` each dataset has trained ``w_i t`` tokens, give or take its sequence in
progress. Blend epoch ``e`` is the virtual times ``[e V, (e + 1) V)``, ``V = T_0 + T_1 + ...``: dataset ``i``'s starts
in ``[ceil(e w_i V), ceil((e + 1) w_i V))``, exactly those whose virtual time is in the window (the weights as
fractions). Without weights (``w_i = T_i / V``) every dataset makes exactly one pass per blend epoch, in its own epoch's
order; a small dataset with a large weight is repeated (several of its epochs in one blend epoch), as Megatron repeats
it. The blend's sequence ids concatenate the datasets' (dataset ``i``'s sequence ``j`` is ``n_0 + ... + n_{i-1} + j``);
:class:`~.sampler.TokenBudgetSampler` cuts each blend epoch into micro-steps as it cuts a single dataset's epoch.

Worked example: A with sequences of ``[3, 5]`` tokens, B with ``[2, 2, 4]``, weights ``0.75, 0.25``: ``V = 16``.
Blend epoch 0 takes A's starts in ``[0, 12)`` and B's in ``[0, 4)``. With seed 3 A's epochs run ``[1, 0]`` then
``[0, 1]``: starts 0 (5 tokens), 5 (3), 8 (3), 11 (5), virtual times 0, 6.7, 10.7, 14.7; B's epoch 0 runs ``[2, 0, 1]``:
starts 0 (4 tokens), 4, 6, of which only 0 is in the window (virtual time 0). The order: A1, B2 (both at 0: A
first), A0, A0, A1, i.e. ids ``[1, 4, 0, 0, 1]``: 16 tokens of A and 4 of B. Blend epoch 1 takes A's starts in
``[12, 24)`` (16 and 19 or 21: its third epoch) and B's in ``[4, 8)`` (4 and 6).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Sequence

import numpy as np

from .index_check import DataError
from .indexed import DocumentDataset

__all__ = ["BlendedDocuments", "LEGACY_SPLIT", "blend_order", "open_documents", "parse_blend", "split_ranges"]

LEGACY_SPLIT = "969, 30, 1"
"""What Megatron's ``validate_args`` sets ``--split`` to when ``--data-path`` is given without it."""


def parse_blend(data_path: str | Sequence[str], flag: str = "--data-path") -> tuple[list[str], list[float] | None]:
    """The prefixes and weights of a Megatron ``--data-path`` value (megatron-core's ``get_blend_from_list``;
    ``flag``: the option's name in messages).

    ``"P"`` or ``["P"]``: one prefix. An even-length list whose every other entry (from the first) parses as a
    number: ``[W1, P1, W2, P2, ...]``, weights ``[W1, W2, ...]``. Otherwise every entry is a prefix, no weights
    (blended by size). Raises :class:`DataError` for an empty value, weights mixed with prefixes, or a weight that
    is not a positive finite number. Example: ``["30", "a", "70", "b"]`` -> ``(["a", "b"], [30.0, 70.0])``;
    ``["a", "b"]`` -> ``(["a", "b"], None)``; ``["0.5", "a"]`` -> ``(["a"], [0.5])``."""
    items = [data_path] if isinstance(data_path, str) else [str(x) for x in data_path]
    if not items or any(not x.strip() for x in items):
        raise DataError(f"{flag} {items!r}: give a dataset prefix, or weights and prefixes")
    if len(items) % 2:
        return [x.strip() for x in items], None
    raw = items[0::2]
    parsed = [_number(x) for x in raw]
    if all(w is None for w in parsed):
        return [x.strip() for x in items], None
    if any(w is None for w in parsed):
        raise DataError(f"{flag} {' '.join(items)}: give a weight before every prefix or none at all "
                        f"(read as weight, prefix pairs: {raw!r} are not all numbers)")
    weights = [float(w) for w in parsed if w is not None]
    for w, prefix in zip(weights, items[1::2]):
        if not (math.isfinite(w) and w > 0):
            raise DataError(f"{flag}: weight {w} for {prefix}: weights must be positive finite numbers "
                            "(drop a dataset rather than weigh it 0)")
    return [x.strip() for x in items[1::2]], weights


def split_ranges(split: str) -> list[tuple[float, float] | None]:
    """Megatron's ``--split`` as ``(begin, end)`` fractions of the documents for train, valid and test, ``None`` for
    a split with no share (megatron-core's ``parse_and_normalize_split`` and split matrix: the numbers in the
    string, padded with zeros to three, normalised). Raises :class:`DataError` for a string without a positive
    number, more than three numbers. Example: ``"969, 30, 1"`` -> ``[(0, 0.969), (0.969, 0.999), (0.999, 1.0)]``;
    ``"100,0,0"`` -> ``[(0, 1.0), None, None]``."""
    parts = [float(x) for x in re.findall(r"[.0-9]+", split) if x.strip(".")]
    if not parts or len(parts) > 3 or not sum(parts) > 0:
        raise DataError(f"--split {split!r}: give up to three non-negative shares for train, valid and test, "
                        "e.g. 969,30,1 (at least one positive)")
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    edges = [0.0]
    for x in parts:  # normalised, then summed in order: megatron-core's float arithmetic, to the last bit
        edges.append(edges[-1] + x / total)
    return [(b, e) if e > b else None for b, e in zip(edges[:-1], edges[1:])]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _shares(totals: Sequence[int], weights: Sequence[float] | None) -> list[Fraction]:
    """Each dataset's normalised weight, exact: ``weights`` over their sum, or without weights the datasets' tokens
    ``totals`` over theirs (Megatron's blend by size). Example: ``_shares([6, 2], None)`` -> ``[3/4, 1/4]``."""
    raw = [Fraction(t) for t in totals] if weights is None else [Fraction(float(w)) for w in weights]
    norm = sum(raw)
    return [r / norm for r in raw]


def blend_order(lengths: np.ndarray, parts: Sequence[int], weights: Sequence[float] | None, seed: int,
                epoch: int) -> np.ndarray:
    """Sequence ids of blend epoch ``epoch`` in visiting order (module docstring), ``int64``.

    ``lengths``: every dataset's sequence lengths, concatenated (``int64``, each >= 1); ``parts``: the sequences of
    each dataset (summing to ``lengths.size``); ``weights``: one positive number per dataset (normalised here), or
    ``None`` for the datasets' token counts. Pure in its arguments."""
    offsets = np.concatenate(([0], np.cumsum(parts))).astype(np.int64)
    totals = [int(lengths[offsets[i]:offsets[i + 1]].sum()) for i in range(len(parts))]
    total = sum(totals)
    ids, keys, which = [], [], []
    for i, (n, t, w) in enumerate(zip(parts, totals, _shares(totals, weights))):
        lo, hi = math.ceil(epoch * w * total), math.ceil((epoch + 1) * w * total)  # start / w in [e V, (e+1) V)
        if hi <= lo:
            continue
        own = lengths[offsets[i]:offsets[i + 1]]
        for q in range(lo // t, (hi - 1) // t + 1):  # dataset i's own epochs overlapping [lo, hi)
            perm = np.random.default_rng([seed, q, i]).permutation(n).astype(np.int64)
            starts = np.empty(n, dtype=np.int64)
            starts[0] = q * t
            np.cumsum(own[perm[:-1]], out=starts[1:])
            starts[1:] += q * t
            inside = (starts >= lo) & (starts < hi)
            ids.append(perm[inside] + offsets[i])
            keys.append(starts[inside] / float(w))
            which.append(np.full(int(inside.sum()), i, dtype=np.int64))
    if not ids:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((np.concatenate(which), np.concatenate(keys)))
    return np.concatenate(ids)[order]


@dataclass(frozen=True)
class BlendedDocuments:
    """Several :class:`~.indexed.DocumentDataset` as one, sequence ids concatenated (module docstring);
    ``weights``: as given on ``--data-path`` (``None``: by size). Reads and lengths as a single dataset's."""

    datasets: tuple[DocumentDataset, ...]
    weights: tuple[float, ...] | None
    lengths: np.ndarray = field(init=False, repr=False)
    parts: tuple[int, ...] = field(init=False)
    _offsets: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.datasets) < 2:
            raise DataError(f"a blend has at least two datasets, got {len(self.datasets)}")
        if self.weights is not None and len(self.weights) != len(self.datasets):
            raise DataError(f"{len(self.weights)} weights for {len(self.datasets)} datasets")
        set_ = object.__setattr__
        set_(self, "parts", tuple(len(d) for d in self.datasets))
        set_(self, "_offsets", np.concatenate(([0], np.cumsum(self.parts))).astype(np.int64))
        lengths = np.concatenate([d.lengths for d in self.datasets]).astype(np.int64)
        lengths.setflags(write=False)
        set_(self, "lengths", lengths)

    def __len__(self) -> int:
        return int(self.lengths.size)

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum())

    def shares(self) -> list[float]:
        """Each dataset's share of the tokens trained (its normalised weight; by size without weights)."""
        return [float(w) for w in _shares([d.total_tokens for d in self.datasets], self.weights)]

    def describe(self) -> str:
        """One log line per dataset, then the blend's."""
        lines = [d.describe() for d in self.datasets]
        shares = ", ".join(f"{d.prefix} {s:.1%}" for d, s in zip(self.datasets, self.shares()))
        lines.append(f"zeppelin data: blend of {len(self.datasets)} datasets "
                     f"({'weighted' if self.weights is not None else 'by size'}), token shares: {shares}")
        return "\n".join(lines)

    def read(self, seq: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`~.indexed.DocumentDataset.read` of the dataset holding blend sequence ``seq``."""
        n = len(self)
        if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or not 0 <= seq < n:
            raise DataError(f"sequence index {seq!r} is outside [0, {n})")
        i = int(np.searchsorted(self._offsets, seq, side="right")) - 1
        return self.datasets[i].read(int(seq - self._offsets[i]), start, end)


def open_documents(data_path: str | Sequence[str], seq_length: int, split: tuple[float, float] | None = None
                   ) -> DocumentDataset | BlendedDocuments:
    """The documents of a ``--data-path`` value (:func:`parse_blend`): one :class:`~.indexed.DocumentDataset`, or a
    :class:`BlendedDocuments` of several; ``split``: the same share of every dataset's documents (one entry of
    :func:`split_ranges`, as Megatron splits each dataset of a blend), ``None`` for all."""
    prefixes, weights = parse_blend(data_path)
    datasets = tuple(DocumentDataset(prefix=p, seq_length=seq_length, split=split) for p in prefixes)
    if len(datasets) == 1:
        return datasets[0]
    return BlendedDocuments(datasets, None if weights is None else tuple(weights))
