"""Exceptions raised by the distributed runtime."""

from __future__ import annotations

__all__ = [
    "RuntimeInputError",
    "AgreementError",
    "PlanMismatchError",
    "BackendUnavailableError",
    "ZeppelinCommError",
    "ZeppelinTimeoutError",
]


class RuntimeInputError(ValueError):
    """Tensors, a group or a plan that do not fit together (shapes, dtypes, sizes)."""


class AgreementError(RuntimeError):
    """Ranks of one group called attention with settings that must agree but differ
    (softmax scale, head counts, head dim, dtype, routing, check setting, kernel, ...).
    Raised on every rank by the start-of-call check; the message names each field and
    which ranks hold which value."""


class PlanMismatchError(AgreementError):
    """Ranks of one group were handed different step plans."""


class BackendUnavailableError(RuntimeError):
    """An attention kernel backend was requested that is not installed or not usable here."""


class ZeppelinCommError(RuntimeError):
    """A Zeppelin collective or point-to-point transfer failed (a peer closed its
    connection, the process group is broken). The message names the step and the peers."""


class ZeppelinTimeoutError(ZeppelinCommError):
    """A Zeppelin collective or point-to-point transfer did not complete within the
    group's timeout (``ZeppelinGroup.timeout_s``, ``--zeppelin-timeout``): a peer failed,
    hangs, or is running a different step. The message names the step and the peers
    waited for. The process group is unusable afterwards."""
