"""Against a Megatron-LM checkout (tag core_v0.16.1): the patch applies, our flags parse and validate.

The checkout is found through ZEPPELIN_MEGATRON_LM (default /work/ext/Megatron-LM);
without it these tests skip (CI cannot fetch Megatron-LM). The parsing checks run
in a subprocess so the checkout's ``megatron`` package never mixes with the
installed megatron-core wheel in this process.
"""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO

TAG = "core_v0.16.1"
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def megatron_lm() -> Path:
    path = Path(os.environ.get("ZEPPELIN_MEGATRON_LM", "/work/ext/Megatron-LM"))
    if not (path / "pretrain_gpt.py").is_file():
        pytest.skip(f"no Megatron-LM checkout at {path} (set ZEPPELIN_MEGATRON_LM to one at tag {TAG})")
    return path


def _tag_file(megatron_lm: Path, name: str) -> str:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = subprocess.run(["git", "-C", str(megatron_lm), "show", f"{TAG}:{name}"], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"{megatron_lm} has no tag {TAG}: {r.stderr.strip()}")
    return r.stdout


def test_patch_applies_to_tag(megatron_lm: Path, tmp_path: Path) -> None:
    patch = REPO / "patches" / "pretrain_gpt.patch"
    assert TAG in (REPO / "patches" / "README.md").read_text()
    original = _tag_file(megatron_lm, "pretrain_gpt.py")
    (tmp_path / "pretrain_gpt.py").write_text(original)
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, check=True)
    patched = (tmp_path / "pretrain_gpt.py").read_text()
    py_compile.compile(str(tmp_path / "pretrain_gpt.py"), doraise=True)
    assert "zeppelin.check_startup(sys.argv" in patched and "partial(model_provider, model_builder)" in patched
    added = [ln for ln in patch.read_text().splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert len(added) < 25  # small
    # Applying twice fails cleanly (already applied), so users notice a double apply.
    again = subprocess.run(["git", "apply", "--check", str(patch)], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode != 0


@pytest.fixture(scope="module")
def worker_result(megatron_lm: Path) -> dict:
    r = subprocess.run([sys.executable, str(HERE / "checkout_worker.py"), str(megatron_lm), str(REPO)],
                       capture_output=True, text=True, timeout=600)
    for line in r.stdout.splitlines():
        if line.startswith("SKIP "):
            pytest.skip(line[5:])
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"worker failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")


def test_flags_parse_and_validate_with_megatron(worker_result: dict, megatron_lm: Path) -> None:
    # megatron.core is the installed wheel's; megatron.training the checkout's
    assert str(megatron_lm) not in worker_result["core_file"]
    assert worker_result["training_file"].startswith(str(megatron_lm))
    assert worker_result["prepared_tail"] == ["--calculate-per-token-loss", "--dataloader-type", "external"]
    m = worker_result["megatron"]
    assert (m["world_size"], m["data_parallel_size"]) == (32, 16)
    assert m["calculate_per_token_loss"] is True and m["dataloader_type"] == "external"
    s = worker_result["setup"]
    assert s["zeppelin_ranks"] == m["data_parallel_size"] == 16
    assert (s["ranks_per_node"], s["num_micro_batches"], s["pad_to_multiple"], s["kv_heads"]) == (4, 4, 2, 4)
    assert s["ffn"] == m["ffn_hidden_size"] and s["raw_shape_equals_validated"]
    assert worker_result["negation_parses"] == [False, False]


@pytest.mark.parametrize(
    "name, match",
    [
        ("pp", "--pipeline-model-parallel-size 2"),
        ("cp", "--context-parallel-size 2"),
        ("cluster", "32 GPUs but the job has world size 16"),
        ("profile", "does not exist"),
        ("eval", "--valid-data-path"),
        ("dataloader", "--dataloader-type cyclic"),
        ("attention_backend", "--attention-backend local"),
    ],
)
def test_unservable_configs_rejected_by_startup_check(worker_result: dict, name: str, match: str) -> None:
    msg = worker_result["errors"][name]
    assert msg is not None, f"{name}: accepted"
    assert match in msg


UNSERVABLE = ["--zeppelin", "--zeppelin-cluster", f"1x8@{REPO}/configs/clusters/h100.yaml",
              "--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "1024",
              "--max-position-embeddings", "1024", "--micro-batch-size", "1", "--global-batch-size", "8",
              "--train-iters", "1", "--lr", "1e-4", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
              "--data-path", "/nonexistent/prefix", "--eval-iters", "0", "--pipeline-model-parallel-size", "2"]


def _run_until_startup_error(argv: list[str], pythonpath: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, WORLD_SIZE="8", LOCAL_WORLD_SIZE="8", RANK="0",
               PYTHONPATH=os.pathsep.join([*pythonpath, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    if "No module named 'triton'" in r.stderr:
        pytest.skip("megatron.training needs triton, not installed here")
    return r


def test_patched_pretrain_gpt_runs_zeppelin_checks(megatron_lm: Path, tmp_path: Path) -> None:
    # The patched pretrain_gpt.py (in a scratch dir; gpt_builders etc. from the checkout) takes the
    # Zeppelin path on --zeppelin and stops at the start-up check.
    (tmp_path / "pretrain_gpt.py").write_text(_tag_file(megatron_lm, "pretrain_gpt.py"))
    subprocess.run(["git", "apply", str(REPO / "patches" / "pretrain_gpt.patch")], cwd=tmp_path, check=True)
    r = _run_until_startup_error([sys.executable, str(tmp_path / "pretrain_gpt.py"), *UNSERVABLE],
                                 [str(REPO), str(megatron_lm)])
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "--pipeline-model-parallel-size 2: Zeppelin does not support pipeline parallelism" in r.stderr


def test_launcher_exits_before_distributed_init(megatron_lm: Path) -> None:
    argv = [sys.executable, str(REPO / "scripts" / "pretrain_gpt_zeppelin.py"), "--megatron-lm", str(megatron_lm),
            *UNSERVABLE]
    r = _run_until_startup_error(argv, [str(REPO)])
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "--pipeline-model-parallel-size 2: Zeppelin does not support pipeline parallelism" in r.stderr
    assert "initialized" not in r.stdout.lower()  # stopped before torch.distributed


def test_recipes_pass_megatron_and_zeppelin_checks(worker_result: dict) -> None:
    r = worker_result["recipe"]
    assert set(r) == {p.name for p in (REPO / "configs" / "recipes").glob("*.sh")}
    for name, got in r.items():
        assert got["cluster"].startswith("4x8@") and got["cluster"].endswith("configs/clusters/h100.yaml"), name
    seven, thirteen = r["llama7b_4x8_h100.sh"], r["llama13b_4x8_h100_tp2.sh"]
    assert (seven["global_batch_size"], seven["data_parallel_size"], seven["seq_length"]) == (64, 32, 65536)
    assert (thirteen["tensor_parallel"], thirteen["data_parallel_size"], thirteen["num_layers"]) == (2, 16, 40)
    assert thirteen["global_batch_size"] == 32  # 2 micro-steps of 16 Zeppelin ranks
