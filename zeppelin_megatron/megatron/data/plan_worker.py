"""Planning in a worker process: the data iterator's planner without holding the training process's GIL.

:class:`~.iterator.ZeppelinDataIterator` plans micro-step ``k + 1`` on its prefetch thread while micro-step ``k``
trains. The planner is pure Python (about 45-60 ms CPU for a 1M-token step on 128 GPUs, ``benchmarks/plan_speed.py``),
and a thread running it holds the GIL in turns with the training thread, whose Python work (the layers' kernel
launches) then runs slower: ``benchmarks/plan_gil.py`` measures it. :class:`PlanWorker` runs the same planner in a
child Python process instead (``python -m zeppelin_megatron.megatron.data.plan_worker``: it imports the planner
only, no torch, no Megatron and not the launching script), and the prefetch thread waits on a pipe, which releases
the GIL. The planner is pure, so the plan is the one the training process would compute (tested equal).

Protocol, over the child's stdin / stdout: each message is an 8-byte little-endian length and a pickle. The parent
sends the planner once (a picklable callable, e.g. :class:`~zeppelin_megatron.planner.setup.PlanningSetup`), then
one list of lengths per call; the child answers each with ``("ok", plan)`` or ``("error", exception)``, and exits
at end of input (the parent closed the pipe or died). Its stderr is the parent's.

Example::

    worker = PlanWorker(setup.planning)     # starts the child (about 0.3 s: it imports the planner)
    plan = worker([60_000, 500, 700])       # == setup.planning([60_000, 500, 700]), computed in the child
    worker.close()
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import IO, TYPE_CHECKING, Any, Callable, NoReturn, Sequence

from .index_check import DataError

if TYPE_CHECKING:
    from ...planner import StepPlan

__all__ = ["PlanWorker"]

_HEADER = struct.Struct("<Q")


def _write(stream: IO[bytes], data: bytes) -> None:
    """One message: its length, then the pickle ``data``."""
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _send(stream: IO[bytes], obj: object) -> None:
    _write(stream, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _receive(stream: IO[bytes]) -> Any:
    """The next message, or ``EOFError`` when the stream ends before one is complete."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    size = _HEADER.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class PlanWorker:
    """``planner(lengths)`` computed in a child process (module docstring); one call at a time (a lock).

    Raises :class:`DataError` when the child cannot start or has exited (naming its exit code), or after
    :meth:`close`; an exception the planner raises in the child (e.g. ``PlanError`` for a batch that does not fit)
    is raised again here, as raised there.
    """

    def __init__(self, planner: Callable[[Sequence[int]], "StepPlan"]) -> None:
        try:
            payload = pickle.dumps(planner, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise DataError(f"the planner {planner!r:.80} cannot be sent to a planning worker: {exc}") from None
        self._lock = threading.Lock()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the modules this process has
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, env=env)
        except OSError as exc:
            raise DataError(f"cannot start a planning worker ({sys.executable} -m {__name__}): {exc}") from None
        assert self._proc.stdin is not None
        try:
            _write(self._proc.stdin, payload)
        except OSError:
            self._failed()

    @property
    def pid(self) -> int | None:
        """The child's process id (``None`` once closed)."""
        return None if self._proc is None else self._proc.pid

    def __call__(self, lengths: Sequence[int]) -> "StepPlan":
        with self._lock:
            proc = self._proc
            if proc is None:
                raise DataError("the planning worker is closed")
            assert proc.stdin is not None and proc.stdout is not None
            try:
                _send(proc.stdin, [int(s) for s in lengths])
                status, value = _receive(proc.stdout)
            except (OSError, EOFError):
                self._failed()
        if status == "error":
            raise value
        return value  # type: ignore[no-any-return]

    def _failed(self) -> NoReturn:
        proc, self._proc = self._proc, None
        code = None if proc is None else proc.wait(timeout=10)
        raise DataError(f"the planning worker (pid {None if proc is None else proc.pid}) exited with code {code} "
                        "(its error, if any, is above on stderr)")

    def close(self) -> None:
        """End the child (it exits at end of input) and wait for it, killing it after 10 s; idempotent. A call in
        flight on another thread then raises :class:`DataError`."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> "PlanWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_proc", None) is not None:
            try:
                self.close()
            except Exception:  # interpreter shutdown: the child exits at end of input anyway
                pass


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The child's loop: the planner, then one answer per list of lengths, until end of input."""
    planner = _receive(stdin)
    while True:
        try:
            lengths = _receive(stdin)
        except EOFError:
            return
        try:
            answer: tuple[str, object] = ("ok", planner(lengths))
        except Exception as exc:  # sent back and raised again in the parent
            answer = ("error", exc)
        try:
            _send(stdout, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            _send(stdout, ("error", DataError(f"the planning worker could not send its answer: {exc!r}")))


if __name__ == "__main__":
    _out, sys.stdout = sys.stdout.buffer, sys.stderr  # the pipe carries answers only: stray prints go to stderr
    try:
        _serve(sys.stdin.buffer, _out)
    except EOFError:  # the parent went away before sending the planner
        pass
