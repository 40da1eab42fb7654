"""The start-of-call check: do all ranks of the group call attention the same way?

Every rank of a Zeppelin group must call :func:`~.attention.zeppelin_attention`
with the same plan and settings; a difference would otherwise give wrong results
on every rank (a different ``softmax_scale``), a C++ abort (a different head count,
head dim or dtype changes the byte count of every transfer), or a hang (a
different routing sends to other peers). :func:`check_agreement` catches all of
them with **one collective** when all is well: an ``all_reduce(MAX)`` of
``[v, -v]`` for a small int64 vector ``v`` per rank (all ranks agree on a field
exactly when its maximum equals its minimum; a tree all-reduce of 24 int64, so
the cost does not grow with the number of ranks as an all-gather's would):

    field          encoding (int64)                       example
    plan           60-bit hash of plan.digest()           0x3f2a...
    softmax_scale  the float64's bit pattern              0.35355339 -> 4600565431771507043
    hq, hkv        head counts of q and k/v               8, 2
    head_dim       D                                      64
    dtype          index in DTYPES                        torch.bfloat16 -> 3
    routing        1 when the plan's routes are used      1
    check_setting  the caller's check setting (0/1)       1
    kernel         index of the resolved kernel in KERNELS  'flash_attn' -> 2
    device         index of the device type in DEVICES    'cuda' -> 1
    grad           1 when autograd will run a backward    1
    input_problem  1 when this rank's inputs are invalid  0

Every rank sees the same maxima and minima, so when a field differs (or a rank
flags an input problem) all ranks enter a second collective, an ``all_gather``
of the vectors (the error path only), compare all rows and raise together, each
naming the field and which ranks hold which value, e.g. ``softmax_scale differs: ranks 0, 2, 3
have 0.353553391, rank 1 (node 0, local 1) has 0.5``. A plan mismatch raises
:class:`~.errors.PlanMismatchError` (it explains any other difference), then an
invalid input :class:`~.errors.RuntimeInputError` (its own message on its rank,
a pointer to it on the others), then :class:`~.errors.AgreementError`.

The check setting. A rank that skips the check while the others run it would
leave them waiting; so whether a call checks must never depend on a per-rank
setting alone. The caller decides per call on a schedule every rank shares (the
Megatron core attention: the first Zeppelin layer of each forward always checks;
``--zeppelin-check-plan`` only adds the other layers) and passes the setting as
``check_setting``, which is compared like every other field.

The collective runs under the group's timeout with ``blocking=True`` (its result
is read on the host): a rank that never arrives makes the others raise
:class:`~.errors.ZeppelinTimeoutError` within ``group.timeout_s``.
"""

from __future__ import annotations

import struct
import weakref
from dataclasses import astuple, dataclass, fields

import torch
import torch.distributed as dist

from .errors import AgreementError, PlanMismatchError, RuntimeInputError
from .group import ZeppelinGroup
from .waits import collective

__all__ = ["CallTerms", "check_agreement", "check_plan_agreement", "plan_hash", "DTYPES", "KERNELS", "DEVICES"]

DTYPES: tuple[torch.dtype, ...] = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
KERNELS: tuple[str, ...] = ("reference", "torch_varlen", "flash_attn", "te")
DEVICES: tuple[str, ...] = ("cpu", "cuda")

_HASHES: "weakref.WeakKeyDictionary[object, int]" = weakref.WeakKeyDictionary()


def plan_hash(plan: object) -> int:
    """63-bit integer from ``plan.digest()`` (SHA-256 of the canonical JSON), cached per plan object."""
    try:
        return _HASHES[plan]
    except (KeyError, TypeError):
        pass
    value = int(plan.digest()[:15], 16)  # type: ignore[attr-defined]  # 60 bits: fits int64
    try:
        _HASHES[plan] = value
    except TypeError:
        pass
    return value


def _index(table: tuple[object, ...], value: object) -> int:
    return table.index(value) if value in table else -1


@dataclass(frozen=True, kw_only=True)
class CallTerms:
    """What this rank's call must share with every other rank's (see the module docstring).

    Built by :meth:`of_call`; ``-1`` marks a field this rank cannot state (its
    inputs are invalid, or a dtype/kernel/device outside the tables).
    """

    plan: int
    softmax_scale: int
    hq: int
    hkv: int
    head_dim: int
    dtype: int
    routing: int
    check_setting: int
    kernel: int
    device: int
    grad: int
    input_problem: int

    @classmethod
    def of_call(
        cls, *, plan: object, q: object, k: object, scale: float | None, routing: bool, check_setting: bool,
        kernel: str | None, problem: str | None,
    ) -> "CallTerms":
        """Terms of one call; ``scale`` None (inputs invalid, no head dim) encodes as -1."""
        qt: torch.Tensor | None = None
        kt: torch.Tensor | None = None
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 3 and k.dim() == 3:
            qt, kt = q, k
        bits = struct.unpack("<q", struct.pack("<d", float(scale)))[0] if scale is not None else -1
        grad = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k)
        )
        return cls(
            plan=plan_hash(plan),
            softmax_scale=bits,
            hq=qt.shape[1] if qt is not None else -1,
            hkv=kt.shape[1] if kt is not None else -1,
            head_dim=qt.shape[2] if qt is not None else -1,
            dtype=_index(DTYPES, qt.dtype) if qt is not None else -1,
            routing=int(bool(routing)),
            check_setting=int(bool(check_setting)),
            kernel=_index(KERNELS, kernel),
            device=_index(DEVICES, qt.device.type) if qt is not None else -1,
            grad=int(grad),
            input_problem=int(problem is not None),
        )

    def vector(self) -> list[int]:
        return list(astuple(self))


_NAMES = [f.name for f in fields(CallTerms)]


def _show(name: str, value: int) -> str:
    """A field's value as the user wrote it."""
    if value == -1 and name not in ("plan", "softmax_scale"):
        return "unknown"
    if name == "plan":
        return f"plan hash {value:#x}"
    if name == "softmax_scale":
        return "unknown" if value == -1 else f"{struct.unpack('<d', struct.pack('<q', value))[0]:.9g}"
    table = {"dtype": DTYPES, "kernel": KERNELS, "device": DEVICES}.get(name)
    if table is not None:
        return str(table[value]) if 0 <= value < len(table) else f"code {value}"
    if name in ("routing", "check_setting", "grad"):
        return "on" if value else "off"
    return str(value)


def _differences(rows: dict[int, list[int]], group: ZeppelinGroup, skip: set[str]) -> list[str]:
    """One line per field on which ranks differ: each value and the ranks holding it."""
    out = []
    for i, name in enumerate(_NAMES):
        if name in skip:
            continue
        by_value: dict[int, list[int]] = {}
        for rank in sorted(rows):
            by_value.setdefault(rows[rank][i], []).append(rank)
        if len(by_value) > 1:
            groups = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[1]))
            out.append(f"{name} differs: " + ", ".join(
                f"{group.describe_ranks(rs)} {'has' if len(rs) == 1 else 'have'} {_show(name, v)}" for v, rs in groups
            ))
    return out


def check_agreement(terms: CallTerms, group: ZeppelinGroup, device: torch.device,
                    problem: str | Exception | None = None, *, what: str = "the start-of-call agreement check") -> None:
    """Raise on every rank unless all ranks of ``group`` hold the same ``terms`` and valid inputs.

    One ``all_reduce(MAX)`` of ``2 x len(CallTerms fields)`` int64 (on ``device`` for
    NCCL, the CPU for gloo); when it shows a difference, an ``all_gather`` of every
    rank's vector to name the ranks (the same decision on every rank). ``problem``: this rank's input error, a message
    (raised as :class:`RuntimeInputError`) or an exception (raised as is); raised
    here, after the collective, so the other ranks raise too instead of waiting.
    """
    own: Exception | None = None
    if problem is not None:
        own = problem if isinstance(problem, Exception) else RuntimeInputError(problem)
    if group.size == 1:
        if own is not None:
            raise own
        return
    dev = device if group.backend == "nccl" else torch.device("cpu")
    vec = terms.vector()
    both = torch.tensor(vec + [-x for x in vec], dtype=torch.int64, device=dev)
    step = f"{what} (plan hash {terms.plan:#x})"
    collective(lambda: dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group.pg, async_op=True), group,
               what=step, blocking=True)
    extremes = both.cpu().tolist()
    n = len(vec)
    if all(extremes[i] == -extremes[n + i] for i in range(n)) and extremes[_NAMES.index("input_problem")] == 0:
        return  # every field has one value on all ranks, and no rank flagged its inputs
    mine = torch.tensor(vec, dtype=torch.int64, device=dev)
    gathered = [torch.empty_like(mine) for _ in range(group.size)]
    collective(lambda: dist.all_gather(gathered, mine, group=group.pg, async_op=True), group,
               what=step + " naming the ranks that differ", blocking=True)
    table = torch.stack(gathered).cpu().tolist()  # process-group order
    rows = {group.zeppelin_rank(g): row for g, row in enumerate(table)}
    plan_i, prob_i = _NAMES.index("plan"), _NAMES.index("input_problem")
    hashes = {row[plan_i] for row in rows.values()}
    if len(hashes) > 1:
        lines = _differences(rows, group, {"input_problem"})
        raise PlanMismatchError(
            f"ranks of the Zeppelin group hold different step plans (seen from rank {group.rank}): "
            + "; ".join(lines)
            + "; every rank must pass the same StepPlan (build it from the same lengths and options, or broadcast it)"
            + (f"; this rank's inputs are also invalid: {problem}" if problem else "")
        )
    bad = [r for r, row in rows.items() if row[prob_i]]
    if own is not None:
        raise own
    if bad:
        raise RuntimeInputError(
            f"rank {group.rank}: {group.describe_ranks(bad)} of the Zeppelin group rejected its inputs "
            "(see that rank's error)"
        )
    lines = _differences(rows, group, {"input_problem"})
    if lines:
        raise AgreementError(
            f"rank {group.rank}: ranks of the Zeppelin group called attention with settings that must agree: "
            + "; ".join(lines)
            + " (every rank must pass the same softmax_scale, heads, head dim, dtype, routing, check setting and "
            "backend)"
        )


def check_plan_agreement(plan: object, group: ZeppelinGroup, device: torch.device,
                         problem: str | Exception | None = None) -> None:
    """Plan-only agreement (the other fields are taken as agreed): :func:`check_agreement` of the plan hash."""
    terms = CallTerms(plan=plan_hash(plan), softmax_scale=-1, hq=-1, hkv=-1, head_dim=-1, dtype=-1, routing=0,
                      check_setting=1, kernel=-1, device=-1, grad=0, input_problem=int(problem is not None))
    check_agreement(terms, group, device, problem)
