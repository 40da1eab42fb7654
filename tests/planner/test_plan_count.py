"""benchmarks/plan_count.py: planning work in instructions (valgrind's callgrind), plan_speed.py's batches."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "plan_count.py"
SMALL = ["--cluster", "1x8", "--tokens", "40000", "--repeat", "2"]


def _run(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


def test_the_measured_process_plans_or_only_builds_the_batches() -> None:
    for mode in ("plan", "none"):
        done = _run("--inner", mode, *SMALL)
        assert done.returncode == 0 and done.stdout == "", (mode, done.stderr[-500:])


def test_without_valgrind_it_says_so_and_exits_2(tmp_path: Path) -> None:
    done = _run(*SMALL, path=str(tmp_path))  # an empty folder: no valgrind on PATH
    assert done.returncode == 2 and "needs valgrind" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_counts_the_instructions_of_planning() -> None:
    done = _run(*SMALL)
    assert done.returncode == 0, done.stderr[-800:]
    got = re.search(r"([\d.]+) M instructions \(([\d.]+) M with the batches built, ([\d.]+) M without planning\)",
                    done.stdout)
    assert got is not None, done.stdout
    diff, plan, none = map(float, got.groups())
    assert diff > 1.0 and abs(plan - none - diff) < 0.2  # planning two batches of 40k tokens: millions, not zero
