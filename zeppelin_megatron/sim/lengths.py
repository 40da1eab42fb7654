"""Length sources: named synthetic long-tailed distributions, text files, Megatron datasets.

Every distribution draws document lengths; a *step* is a global batch of
``tokens_per_step`` tokens: documents are drawn until the budget is reached
and the last one is cut so the step holds exactly that many tokens (as a
packing data loader would). Documents longer than the distribution's maximum
are cut into maximum-length pieces plus a remainder (a pipeline with a
maximum sequence length keeps all tokens). Step ``k`` of seed ``s`` uses
``numpy.random.default_rng([s, k])``: deterministic and independent of how many
steps are drawn.

Parameters (ESTIMATED from published aggregate statistics, not fitted to the
raw corpora; treat them as plausible shapes, not as the corpora):

* ``github-*``: source files. The Pile (Gao et al. 2020, Table 1) reports a
  mean GitHub document of 5.25 KiB, i.e. about 1.3k tokens at ~4 bytes per
  token; file sizes are heavy-tailed. Log-normal with ``sigma = 1.6`` and
  median 370 tokens (mean ``370 e^{1.28} ~ 1.3k``).
* ``arxiv-*``: LaTeX papers. The Pile reports a mean ArXiv document of
  46.6 KiB, about 11.9k tokens; papers are less skewed than code. Log-normal
  with ``sigma = 0.9``, median 7.9k tokens (mean ``7.9k e^{0.405} ~ 11.9k``).
* ``prolong-*``: the ProLong long-context mixture (Gao et al. 2024, "How to
  Train Long-Context Language Models (Effectively)"): about 60 % of tokens from
  long sources (code repositories, books, packed to the training length) and
  40 % from short data. Mixture by tokens: 60 % long documents log-uniform in
  ``[16k, max]``, 40 % short ones log-normal with median 1k tokens,
  ``sigma = 1.2``.

The ``-64k`` / ``-128k`` suffix is the maximum length (65 536 / 131 072 tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..lengths_io import read_lengths

__all__ = ["LengthDistribution", "DISTRIBUTIONS", "get_distribution", "sample_steps", "split_steps",
           "lengths_from_file", "lengths_from_dataset"]


@dataclass(frozen=True, kw_only=True)
class LengthDistribution:
    """A document-length distribution: a log-normal body plus an optional log-uniform long part.

    ``long_token_share``: fraction of *tokens* from the long part (0: none);
    ``long_min``: lower end of the long part; every length is at most ``max_len``.
    """

    name: str
    median: float
    sigma: float
    max_len: int
    long_token_share: float = 0.0
    long_min: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if not self.median >= 1 or not self.sigma > 0:
            raise ValueError(f"{self.name}: median {self.median} must be >= 1 and sigma {self.sigma} > 0")
        if self.max_len < 1:
            raise ValueError(f"{self.name}: max_len must be >= 1, got {self.max_len}")
        if not 0 <= self.long_token_share < 1:
            raise ValueError(f"{self.name}: long_token_share {self.long_token_share} must be in [0, 1)")
        if self.long_token_share and not 1 <= self.long_min < self.max_len:
            raise ValueError(f"{self.name}: long_min {self.long_min} must be in [1, {self.max_len})")

    def _long_doc_probability(self) -> float:
        """Per-document probability of the long part that gives ``long_token_share`` of the tokens."""
        if not self.long_token_share:
            return 0.0
        a, b = self.long_min, self.max_len
        mean_long = (b - a) / math.log(b / a)                      # log-uniform mean
        mean_short = self.median * math.exp(self.sigma ** 2 / 2)   # log-normal mean
        w_long = self.long_token_share / mean_long
        w_short = (1 - self.long_token_share) / mean_short
        return w_long / (w_long + w_short)

    def documents(self, rng: np.random.Generator, tokens: int) -> list[int]:
        """Document lengths (each <= max_len) summing to exactly ``tokens``."""
        if tokens < 1:
            raise ValueError(f"tokens per step must be >= 1, got {tokens}")
        p_long = self._long_doc_probability()
        out: list[int] = []
        left = tokens
        while left > 0:
            n = max(16, int(left / (self.median * 2)))  # draw in vectorised chunks
            is_long = rng.random(n) < p_long
            body = rng.lognormal(math.log(self.median), self.sigma, n)
            tail = np.exp(rng.uniform(math.log(max(self.long_min, 1)), math.log(self.max_len), n))
            docs = np.where(is_long, tail, body)
            for d in docs:
                length = max(1, int(d))
                while length > 0 and left > 0:
                    piece = min(length, self.max_len, left)
                    out.append(piece)
                    left -= piece
                    length -= piece
                if left == 0:
                    break
        return out


def _dists() -> dict[str, LengthDistribution]:
    out = {}
    for cap, tag in ((65536, "64k"), (131072, "128k")):
        out[f"github-{tag}"] = LengthDistribution(
            name=f"github-{tag}", median=370, sigma=1.6, max_len=cap,
            source="estimated: The Pile GitHub mean 5.25 KiB/doc (~1.3k tokens), log-normal sigma 1.6")
        out[f"arxiv-{tag}"] = LengthDistribution(
            name=f"arxiv-{tag}", median=7900, sigma=0.9, max_len=cap,
            source="estimated: The Pile ArXiv mean 46.6 KiB/doc (~11.9k tokens), log-normal sigma 0.9")
        out[f"prolong-{tag}"] = LengthDistribution(
            name=f"prolong-{tag}", median=1000, sigma=1.2, max_len=cap, long_token_share=0.6, long_min=16384,
            source="estimated: ProLong mixture, ~60% of tokens from long sources, 40% short")
    return out


DISTRIBUTIONS: dict[str, LengthDistribution] = _dists()


def get_distribution(name: str) -> LengthDistribution:
    if name not in DISTRIBUTIONS:
        raise ValueError(f"unknown length distribution {name!r}; known: {', '.join(DISTRIBUTIONS)}")
    return DISTRIBUTIONS[name]


def sample_steps(name: str, steps: int, tokens_per_step: int, seed: int) -> list[list[int]]:
    """``steps`` global batches of exactly ``tokens_per_step`` tokens from distribution ``name``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    dist = get_distribution(name)
    return [dist.documents(np.random.default_rng([seed, k]), tokens_per_step) for k in range(steps)]


def split_steps(lengths: Sequence[int], steps: int, tokens_per_step: int, *, max_len: int | None = None,
                source: str = "lengths") -> list[list[int]]:
    """Consecutive global batches of exactly ``tokens_per_step`` tokens from a list of document lengths.

    Documents are taken in order; one that crosses a step boundary is cut there
    (the rest starts the next step); documents longer than ``max_len`` are cut
    into pieces. Raises ``ValueError`` when the list holds fewer than
    ``steps * tokens_per_step`` tokens (naming both numbers).
    """
    if steps < 1 or tokens_per_step < 1:
        raise ValueError(f"steps ({steps}) and tokens_per_step ({tokens_per_step}) must be >= 1")
    bad = [(i, s) for i, s in enumerate(lengths) if int(s) < 0]
    if bad:
        raise ValueError(f"{source}: document {bad[0][0]} has negative length {bad[0][1]}")
    total = int(sum(int(s) for s in lengths))
    need = steps * tokens_per_step
    if total < need:
        raise ValueError(f"{source} holds {total} tokens, fewer than {steps} steps x {tokens_per_step} = {need}")
    out: list[list[int]] = [[]]
    left = tokens_per_step
    cap = max_len or tokens_per_step
    for s in lengths:
        s = int(s)
        while s > 0:
            piece = min(s, left, cap)
            out[-1].append(piece)
            s -= piece
            left -= piece
            if left == 0:
                if len(out) == steps:
                    return out
                out.append([])
                left = tokens_per_step
    raise AssertionError("unreachable: the token count was checked")


def lengths_from_file(path: str | Path) -> list[int]:
    """One length per line (``#`` comments); the same reader as ``zeppelin plan --lengths``."""
    return read_lengths(path)


def lengths_from_dataset(prefix: str) -> list[int]:
    """Document lengths of the Megatron indexed dataset at ``prefix`` (``.idx`` only).

    Imported lazily: only :mod:`zeppelin_megatron.megatron` reads Megatron's format.
    """
    from ..megatron.data.indexed import document_lengths
    return [int(x) for x in document_lengths(prefix)]


def lengths_from_blend(data_path: Sequence[str], seed: int, tokens: int) -> list[int]:
    """Document lengths of a blend of Megatron indexed datasets (``--data-path``'s words: ``W1 P1 W2 P2 ...``, or
    ``P1 P2 ...`` by size) in the order training visits it (:func:`~zeppelin_megatron.megatron.data.blend.
    blend_order` with ``seed``), blend epoch after blend epoch until at least ``tokens`` tokens; documents of 0
    tokens left out. Raises ``ValueError`` for a dataset with no tokens (and the blend's own errors)."""
    from ..megatron.data.blend import blend_order, parse_blend
    from ..megatron.data.indexed import document_lengths
    prefixes, weights = parse_blend(list(data_path), "--dataset")
    per = [np.asarray(document_lengths(p), dtype=np.int64) for p in prefixes]
    per = [x[x > 0] for x in per]
    empty = [p for p, x in zip(prefixes, per) if x.size == 0]
    if empty:
        raise ValueError(f"--dataset: {empty[0]} has no document of 1 token or more")
    flat = np.concatenate(per)
    parts = [int(x.size) for x in per]
    out: list[int] = []
    total, epoch = 0, 0
    while total < tokens:
        taken = flat[blend_order(flat, parts, weights, seed, epoch)]
        out.extend(int(n) for n in taken)
        total += int(taken.sum())
        epoch += 1
    return out


def training_steps(data_path: Sequence[str], *, seq_length: int, tokens_per_step: int, steps: int, seed: int,
                   split: str | None = None) -> list[list[int]]:
    """The first ``steps`` micro-steps training runs on a dataset or blend (``--data-path``'s words), as lists of
    sequence lengths: documents truncated at ``seq_length`` inputs (those under 2 tokens skipped), cut by the
    training sampler (:class:`~zeppelin_megatron.megatron.data.sampler.TokenBudgetSampler`, budget
    ``tokens_per_step``, ``seed``: shuffled epochs, a blend's order, no document split across micro-steps), from
    ``split``'s training share of the documents (Megatron's ``--split``; ``None``: every document). Raises the
    data side's ``DataError`` (a ``ValueError``) for a sequence over the budget, a bad blend or split."""
    from ..megatron.data.blend import open_documents, split_ranges
    from ..megatron.data.sampler import TokenBudgetSampler
    share = None
    if split is not None:
        share = split_ranges(split)[0]
        if share is None:
            raise ValueError(f"--split {split}: gives training no share of the dataset")
    ds = open_documents(list(data_path), seq_length, share)
    sampler = TokenBudgetSampler(lengths=ds.lengths, budget=tokens_per_step, seed=seed, parts=ds.parts,
                                 weights=ds.weights)
    return [[int(ds.lengths[i]) for i in sampler.micro_step(k)] for k in range(steps)]
