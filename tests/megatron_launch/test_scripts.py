"""The shell launchers and recipes parse (bash -n); the Python launcher's --megatron-lm handling."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from .helpers import REPO

SHELL = sorted([*(REPO / "scripts").glob("*.sh"), *(REPO / "scripts").glob("*.sbatch"),
                *(REPO / "configs" / "recipes").glob("*.sh")])


def test_there_are_launchers() -> None:
    names = {p.name for p in SHELL}
    assert {"single_node.sh", "slurm_multi_node.sbatch", "llama7b_4x8_h100.sh"} <= names


@pytest.mark.parametrize("path", SHELL, ids=lambda p: p.name)
def test_bash_syntax(path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _launcher():
    spec = importlib.util.spec_from_file_location("pretrain_gpt_zeppelin",
                                                  REPO / "scripts" / "pretrain_gpt_zeppelin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_megatron_lm_flag_and_env(tmp_path: Path) -> None:
    mod = _launcher()
    (tmp_path / "pretrain_gpt.py").write_text("")
    path, argv = mod.split_megatron_lm(["x.py", "--zeppelin", "--megatron-lm", str(tmp_path), "--seq-length", "8"],
                                       None)
    assert path == str(tmp_path.resolve()) and argv == ["x.py", "--zeppelin", "--seq-length", "8"]
    path, argv = mod.split_megatron_lm(["x.py", f"--megatron-lm={tmp_path}"], "/elsewhere")
    assert path == str(tmp_path.resolve()) and argv == ["x.py"]
    path, _ = mod.split_megatron_lm(["x.py"], str(tmp_path))
    assert path == str(tmp_path.resolve())
    with pytest.raises(SystemExit, match="MEGATRON_LM"):
        mod.split_megatron_lm(["x.py"], None)
    with pytest.raises(SystemExit, match="no pretrain_gpt.py"):
        mod.split_megatron_lm(["x.py", "--megatron-lm", str(tmp_path / "missing")], None)
