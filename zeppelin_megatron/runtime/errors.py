"""Exceptions raised by the distributed runtime."""

from __future__ import annotations

__all__ = ["RuntimeInputError", "PlanMismatchError", "BackendUnavailableError"]


class RuntimeInputError(ValueError):
    """Tensors, a group or a plan that do not fit together (shapes, dtypes, sizes)."""


class PlanMismatchError(RuntimeError):
    """Ranks of one group were handed different step plans."""


class BackendUnavailableError(RuntimeError):
    """An attention kernel backend was requested that is not installed or not usable here."""
