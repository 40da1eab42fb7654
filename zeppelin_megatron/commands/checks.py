"""Up-front checks of a command's paths and extras: a clear one-line error before any work.

Every ``zeppelin`` command calls these on its flags before planning, simulating
or measuring, so a typo in ``--json`` does not cost the run::

    zeppelin plan ... --json /no/such/dir/plan.json
    zeppelin plan: error: --json /no/such/dir/plan.json: directory /no/such/dir does not exist

Errors are :class:`UsageError` (a ``ValueError``: the CLI prints it and exits 2).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any, Sequence

from ..planner.cluster import ClusterError
from ..planner.setup import check_cluster_shape

__all__ = ["UsageError", "check_output_file", "check_output_dir", "check_input_file", "check_cluster_spec",
           "check_matplotlib", "profile_range_warning"]

_SHAPE = re.compile(r"^\s*-?\d+\s*[xX]\s*-?\d+\s*$")


class UsageError(ValueError):
    """A flag whose path or value cannot work; raised before any work starts."""


def _probe_dir(directory: Path, flag: str, path: str | Path) -> None:
    """Raise unless a file can be created in ``directory`` (tried for real: permissions, read-only mounts)."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".zeppelin-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write in directory {directory}: {exc.strerror or exc}") from None


def check_output_file(path: str | Path | None, flag: str) -> None:
    """``path`` (if given) can be written: not a directory, its directory exists and is writable.

    An existing file is opened for appending and closed (its content is kept).
    """
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory, expected a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise UsageError(f"{flag} {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is not a directory")
    if p.exists():
        try:
            with open(p, "ab"):
                pass
        except OSError as exc:
            raise UsageError(f"{flag} {path}: cannot be written: {exc.strerror or exc}") from None
    else:
        _probe_dir(parent, flag, path)


def check_output_dir(path: str | Path, flag: str) -> None:
    """``path`` is a writable directory or can be created (its nearest existing ancestor is a writable directory)."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{flag} {path}: is a file, expected a directory")
        _probe_dir(p, flag, path)
        return
    ancestor = p.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{flag} {path}: {ancestor} is not a directory")
    _probe_dir(ancestor, flag, path)


def check_input_file(path: str | Path | None, flag: str, *, text: bool = True) -> None:
    """``path`` (if given) is an existing, readable file (not a directory); with ``text``, UTF-8 text
    (JSON and YAML inputs: a binary file is named here instead of failing inside a parser)."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory, expected a file")
    if not p.exists():
        raise UsageError(f"{flag} {path}: file does not exist")
    try:
        with open(p, "rb") as f:
            data = f.read() if text else f.read(1)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot be read: {exc.strerror or exc}") from None
    if text:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"{flag} {path}: not a text file (byte {exc.start} is {data[exc.start]:#04x}, not "
                             "UTF-8)") from None


def check_cluster_spec(spec: str, flag: str = "--cluster") -> None:
    """``NODESxGPUS`` with both numbers >= 1, and the YAML of ``FILE`` / ``NODESxGPUS@FILE`` readable.

    >>> check_cluster_spec("4x0")
    Traceback (most recent call last):
    ...
    zeppelin_megatron.commands.checks.UsageError: --cluster: cluster '4x0': GPUs per node is 0, expected at least 1
    """
    try:
        check_cluster_shape(spec)
    except ClusterError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    shape, at, rest = str(spec).partition("@")
    if at:
        if not _SHAPE.match(shape):
            raise UsageError(f"{flag} {spec}: {shape!r} is not of the form NODESxGPUS (e.g. 4x8@{rest})")
        check_input_file(rest, flag)
    elif not _SHAPE.match(shape):
        if not Path(spec).exists():
            raise UsageError(f"{flag} {spec}: neither NODESxGPUS (e.g. 4x8) nor an existing cluster YAML file")
        check_input_file(spec, flag)


def check_matplotlib(flag: str) -> None:
    """Import matplotlib now (not after the work) or say how to install it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"{flag} needs matplotlib: pip install 'zeppelin_megatron[plot]'") from None


def profile_range_warning(profile: Any, lengths: Sequence[int], *, factor: float = 4.0) -> str | None:
    """A warning when the batch's longest sequence is over ``factor`` x the profile's longest measured length.

    Above the last profiled length the cost model holds the attention rate of
    that point (``CostModel`` docstring): a profile of 256-token rows says
    little about a 100k-token document.
    """
    causal = [r.seqlen for r in profile.attention if r.causal]
    if not causal or not lengths:
        return None
    top, longest = max(causal), max(lengths)
    if longest <= factor * top:
        return None
    return (f"warning: the profile measured attention up to {top} tokens but the longest sequence has {longest} "
            f"tokens ({longest / top:.0f}x): its time is extrapolated (rate held at {top} tokens); measure longer "
            f"lengths with `zeppelin profile --lengths ...,{1 << max(longest - 1, 1).bit_length()}`")

