"""Against Megatron-LM checkouts: the patch applies, our flags parse and validate, and the launcher and
the patched ``pretrain_gpt.py`` get as far as Megatron's own "Megatron requires CUDA." assertion.

Checkouts: ``$ZEPPELIN_MEGATRON_LM`` when it is set (one checkout of any supported version); else the
snapshots in ``tests/fixtures/megatron-lm/`` (``pretrain_gpt.py`` and ``megatron/training`` of
core_v0.16.1, core_v0.19.0 and main d98e8a6, unmodified; ``../shared/megatron-lm/<name>`` stands in
for a folder missing there). A snapshot runs with the installed megatron-core of its line:

* ``core_v0.16.1`` with megatron-core 0.16.x (Python 3.10-3.11: CI stage 1);
* ``core_v0.19.0`` and ``main-d98e8a6`` with 0.19.x (Python >= 3.12: CI stage 2); no released
  megatron-core matches main, so main runs on 0.19.x with ``mcore_main_compat`` (six inert
  stand-ins for names only main's core has).

A snapshot whose megatron-core line is not installed skips with that reason; a missing snapshot skips
with a message; a missing Python package fails (``.[test]`` installs what ``megatron.training``
imports). Everything Megatron runs in a subprocess, so a checkout's ``megatron`` package never mixes
with the installed one in this process. The snapshots lack Megatron-LM's top-level
``gpt_builders.py`` / ``model_provider.py`` (and core_v0.16.1 its ``megatron/rl``):
``tests/fixtures/megatron-lm/stubs`` stands in for them; none is called before the CUDA assertion.
"""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from .helpers import REPO

HERE = Path(__file__).resolve().parent
FIXTURES = REPO / "tests" / "fixtures" / "megatron-lm"
SHARED = REPO.parent / "shared" / "megatron-lm"
STUBS = FIXTURES / "stubs"
PATCH = REPO / "patches" / "pretrain_gpt.patch"

# snapshot -> (megatron-core line it runs with, pretrain() convention it has, needs mcore_main_compat)
SNAPSHOTS = {
    "core_v0.16.1": ("0.16", "args", False),
    "core_v0.19.0": ("0.19", "model-config", False),
    "main-d98e8a6": ("0.19", "model-config", True),
}
CUDA_ASSERTION = "AssertionError: Megatron requires CUDA."


@dataclass(frozen=True)
class Checkout:
    name: str
    path: Path
    convention: str | None  # expected pretrain() convention (None: not known for a user's checkout)
    compat: bool  # run with mcore_main_compat
    extras: tuple[str, ...]  # on PYTHONPATH after the checkout (stand-ins for files a snapshot lacks)


def _installed_core_line() -> str:
    try:
        version = metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        pytest.fail("megatron-core is not installed (pip install -e '.[test]')")
    return ".".join(version.split(".")[:2])


def _checkout(name: str) -> Checkout:
    if name == "ZEPPELIN_MEGATRON_LM":
        path = Path(os.environ["ZEPPELIN_MEGATRON_LM"]).resolve()
        if not (path / "pretrain_gpt.py").is_file():
            pytest.skip(f"ZEPPELIN_MEGATRON_LM={path} has no pretrain_gpt.py")
        extras = () if (path / "model_provider.py").is_file() else (str(STUBS),)
        return Checkout(name, path, None, False, extras)
    line, convention, compat = SNAPSHOTS[name]
    path = next((p for p in (FIXTURES / name, SHARED / name) if (p / "pretrain_gpt.py").is_file()), None)
    if path is None:
        pytest.skip(f"Megatron-LM snapshot {name} is missing (looked in {FIXTURES} and {SHARED})")
    installed = _installed_core_line()
    if installed != line:
        pytest.skip(f"snapshot {name} runs with megatron-core {line}.x; this environment has {installed}.x "
                    f"(CI runs it in the stage with Python {'3.11' if line == '0.16' else '3.12'})")
    return Checkout(name, path.resolve(), convention, compat, (str(STUBS),))


def _params() -> list[str]:
    return ["ZEPPELIN_MEGATRON_LM"] if os.environ.get("ZEPPELIN_MEGATRON_LM") else list(SNAPSHOTS)


@pytest.fixture(scope="module", params=_params())
def checkout(request: pytest.FixtureRequest) -> Checkout:
    return _checkout(request.param)


# -- the patch ----------------------------------------------------------------------------------


def _pristine_pretrain_gpt(checkout: Checkout) -> str:
    text = (checkout.path / "pretrain_gpt.py").read_text()
    if "zeppelin_megatron" in text:  # a user's checkout that is already patched
        tmp_undo = subprocess.run(["git", "-C", str(checkout.path), "show", "HEAD:pretrain_gpt.py"],
                                  capture_output=True, text=True)
        if tmp_undo.returncode:
            pytest.skip(f"{checkout.path}/pretrain_gpt.py is already patched and not in git")
        text = tmp_undo.stdout
    return text


def _apply(patch: Path, cwd: Path, *, check: bool = False) -> subprocess.CompletedProcess:
    if shutil.which("git"):
        cmd = ["git", "apply", *(["--check"] if check else []), str(patch)]
    elif shutil.which("patch"):
        cmd = ["patch", "-p1", "--forward", *(["--dry-run"] if check else []), "-i", str(patch)]
    else:
        pytest.skip("neither git nor patch is installed")
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def _patched_script(checkout: Checkout, tmp_path: Path) -> Path:
    script = tmp_path / "pretrain_gpt.py"
    script.write_text(_pristine_pretrain_gpt(checkout))
    r = _apply(PATCH, tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    return script


def test_patch_applies(checkout: Checkout, tmp_path: Path) -> None:
    assert checkout.name == "ZEPPELIN_MEGATRON_LM" or checkout.name in (REPO / "patches" / "README.md").read_text()
    (tmp_path / "pretrain_gpt.py").write_text(_pristine_pretrain_gpt(checkout))
    check = _apply(PATCH, tmp_path, check=True)
    assert check.returncode == 0, check.stderr + check.stdout
    assert _apply(PATCH, tmp_path).returncode == 0
    patched = (tmp_path / "pretrain_gpt.py").read_text()
    py_compile.compile(str(tmp_path / "pretrain_gpt.py"), doraise=True)
    assert "run_pretrain_gpt(sys.modules[__name__], sys.argv" in patched
    added = [ln for ln in PATCH.read_text().splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert len(added) < 12  # small
    # Applying twice fails cleanly (already applied), so users notice a double apply.
    assert _apply(PATCH, tmp_path, check=True).returncode != 0


# -- start-up: the launcher and the patched script stop at Megatron's CUDA assertion ----------------

CPU_FLAGS = ["--zeppelin", "--zeppelin-cluster", f"1x8@{REPO}/configs/clusters/h100.yaml",
             "--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4",
             "--group-query-attention", "--num-query-groups", "2", "--swiglu", "--normalization", "RMSNorm",
             "--position-embedding-type", "rope", "--seq-length", "1024", "--max-position-embeddings", "1024",
             "--micro-batch-size", "1", "--global-batch-size", "16", "--train-iters", "10", "--lr", "1e-4",
             "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--data-path", "/data/corpus_text_document",
             "--eval-iters", "0", "--transformer-impl", "local", "--no-rope-fusion", "--no-persist-layer-norm",
             "--no-gradient-accumulation-fusion", "--attention-dropout", "0.0"]
"""A servable single-node run for 8 ranks, with the flags a machine without Transformer Engine needs (and no
attention dropout, which Megatron's default 0.1 would ask for)."""

WRONG_CLUSTER = ["--zeppelin-cluster", f"2x8@{REPO}/configs/clusters/h100.yaml"]
WRONG_CLUSTER_MESSAGE = "describes 2 x 8 = 16 GPUs but the job has world size 8"


def _run(checkout: Checkout, argv: list[str], pythonpath: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, WORLD_SIZE="8", LOCAL_WORLD_SIZE="8", RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), *pythonpath, *checkout.extras,
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("ZEPPELIN_MEGATRON_LM", None)
    cmd = [sys.executable]
    if checkout.compat:
        cmd += [str(HERE / "run_script.py"), "--mcore-main-compat"]
    return subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=600, env=env)


def _launcher(checkout: Checkout, flags: list[str]) -> subprocess.CompletedProcess:
    return _run(checkout, [str(REPO / "scripts" / "pretrain_gpt_zeppelin.py"), "--megatron-lm", str(checkout.path),
                           *flags], [])


def _patched(checkout: Checkout, tmp_path: Path, flags: list[str]) -> subprocess.CompletedProcess:
    return _run(checkout, [str(_patched_script(checkout, tmp_path)), *flags], [str(checkout.path)])


def _assert_stopped_at_cuda_assertion(r: subprocess.CompletedProcess, checkout: Checkout) -> None:
    tail = f"rc {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-6000:]}"
    assert "zeppelin: cannot run" not in r.stderr and "zeppelin: --" not in r.stderr, tail
    assert r.returncode == 1, tail
    last = r.stderr.strip().splitlines()[-1]
    assert last == CUDA_ASSERTION, tail  # the run ended on Megatron's own assertion ...
    assert "in initialize_megatron" in r.stderr and "run_pretrain_gpt" in r.stderr, tail  # ... in pretrain()
    convention = checkout.convention or ""
    assert f"zeppelin: Megatron-LM pretrain() convention: {convention}" in r.stdout, tail


def test_launcher_reaches_megatron_cuda_assertion(checkout: Checkout) -> None:
    _assert_stopped_at_cuda_assertion(_launcher(checkout, CPU_FLAGS), checkout)


def test_patched_pretrain_gpt_reaches_megatron_cuda_assertion(checkout: Checkout, tmp_path: Path) -> None:
    _assert_stopped_at_cuda_assertion(_patched(checkout, tmp_path, CPU_FLAGS), checkout)


def test_launcher_wrong_zeppelin_flag_exits_2(checkout: Checkout) -> None:
    r = _launcher(checkout, [*CPU_FLAGS, *WRONG_CLUSTER])
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert WRONG_CLUSTER_MESSAGE in r.stderr
    assert "initialized" not in r.stdout.lower() and CUDA_ASSERTION not in r.stderr  # stopped before Megatron


def test_patched_pretrain_gpt_wrong_zeppelin_flag_exits_2(checkout: Checkout, tmp_path: Path) -> None:
    r = _patched(checkout, tmp_path, [*CPU_FLAGS, *WRONG_CLUSTER])
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert WRONG_CLUSTER_MESSAGE in r.stderr
    assert CUDA_ASSERTION not in r.stderr


def test_launcher_unservable_megatron_flags_exit_2(checkout: Checkout) -> None:
    r = _launcher(checkout, [*CPU_FLAGS, "--pipeline-model-parallel-size", "2", "--context-parallel-size", "2"])
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "--pipeline-model-parallel-size 2: Zeppelin does not support pipeline parallelism" in r.stderr
    assert "--context-parallel-size 2: Zeppelin replaces context parallelism" in r.stderr
    assert CUDA_ASSERTION not in r.stderr


def test_patched_pretrain_gpt_without_zeppelin_is_megatrons(checkout: Checkout, tmp_path: Path) -> None:
    # Without --zeppelin the patched file runs Megatron's own path (here: to the same CUDA assertion).
    flags = [a for a in CPU_FLAGS if a != "--zeppelin"]
    flags = flags[:flags.index("--zeppelin-cluster")] + flags[flags.index("--zeppelin-cluster") + 2:]
    r = _patched(checkout, tmp_path, flags)
    assert r.stderr.strip().splitlines()[-1] == CUDA_ASSERTION, r.stderr[-3000:]
    assert "run_pretrain_gpt" not in r.stderr and "zeppelin" not in r.stdout


# -- the model Megatron builds carries Zeppelin's spec (CPU, gloo, one rank) -------------------------


def test_model_built_as_pretrain_builds_it_has_zeppelin_attention(checkout: Checkout) -> None:
    if checkout.compat:
        pytest.skip("main's GPTModelBuilder passes GPTModel arguments megatron-core 0.19.x does not have "
                    "(logit_dtype); run with ZEPPELIN_MEGATRON_LM set to a full main checkout")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, ZEPPELIN_TEST_PORT=str(port))
    r = subprocess.run([sys.executable, str(HERE / "builder_worker.py"), str(checkout.path), str(REPO),
                        *checkout.extras], capture_output=True, text=True, timeout=600, env=env)
    result = next((json.loads(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert result is not None, f"worker failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    if checkout.convention:
        assert result["convention"] == checkout.convention
    if result["convention"] == "model-config":  # Megatron's own builder, from the GPTModelConfig we handed it
        assert result["built_by"] == "megatron.training.models.gpt.GPTModelBuilder"
    else:  # what Megatron's model_provider calls
        assert result["built_by"] == "zeppelin_megatron.megatron.pretrain.zeppelin_gpt_builder"
    assert result["model"] == "GPTModel"
    assert result["core_attention"] == ["ZeppelinCoreAttention"] * 2 and result["zeppelin_attention"] == 2
    assert result["prepared"] and result["rope_hooks"] == 1  # the pre-wrap hook / builder prepared it


# -- Megatron's parser and validate_args, in-process in a worker -----------------------------------


@pytest.fixture(scope="module")
def worker_result(checkout: Checkout) -> dict:
    cmd = [sys.executable, str(HERE / "checkout_worker.py"), str(checkout.path), str(REPO),
           *(["--mcore-main-compat"] if checkout.compat else []), *checkout.extras]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"worker failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")


def test_flags_parse_and_validate_with_megatron(worker_result: dict, checkout: Checkout) -> None:
    # megatron.training is the checkout's; megatron.core the installed wheel's unless the checkout has one
    assert worker_result["training_file"].startswith(str(checkout.path))
    own_core = (checkout.path / "megatron" / "core" / "__init__.py").is_file()
    assert worker_result["core_file"].startswith(str(checkout.path)) == own_core
    if checkout.convention:
        assert worker_result["convention"] == checkout.convention
    assert worker_result["prepared_tail"] == ["--calculate-per-token-loss", "--dataloader-type", "external"]
    m = worker_result["megatron"]
    assert (m["world_size"], m["data_parallel_size"]) == (32, 16)
    assert m["calculate_per_token_loss"] is True and m["dataloader_type"] == "external"
    s = worker_result["setup"]
    assert s["zeppelin_ranks"] == m["data_parallel_size"] == 16
    assert (s["ranks_per_node"], s["num_micro_batches"], s["pad_to_multiple"], s["kv_heads"]) == (4, 4, 2, 4)
    assert s["ffn"] == m["ffn_hidden_size"] and s["raw_shape_equals_validated"]
    assert worker_result["negation_parses"] == [False, False]
    assert worker_result["spec_core_attention"] == "ZeppelinCoreAttention"
    assert worker_result["fp8_pad_to_multiple"] == 32  # --fp8-format hybrid: 16-row GEMMs x TP 2 (sequence parallel)
    if worker_result["phase_consumed"] is not None:  # --phase-transition-iterations 8,4 at iteration 6, GBS 64
        assert worker_result["phase_consumed"] == [[4, 8], (6 - 4) * 64]


def test_batch_schedules_are_megatrons(worker_result: dict, checkout: Checkout) -> None:
    """Zeppelin's step metrics group micro-steps as each Megatron-LM's calculator counts them: the ramp where
    Megatron-LM ramps (16 Zeppelin ranks at TP 2, micro-batch 1: 16 samples a micro-step), no ramp where it
    ignores the flag (0.19 on), and the step schedule where it has one."""
    got = worker_result["batch_schedules"]
    for name, case in got.items():
        assert case["schedule_counts"] == case["megatron_counts"], name
    ramps = "steps" not in got  # the parser has --step-batch-size-schedule from 0.19 on, when the ramp went
    assert (checkout.name == "core_v0.16.1") == ramps or checkout.name == "ZEPPELIN_MEGATRON_LM"
    rampup = got["rampup"]
    assert rampup["megatron_counts"] == ([2, 2] + [4] * 10 if ramps else [4] * 12)  # GBS 64
    assert ("--rampup-batch-size 32 32 64 ignored" in rampup["describe"]) != ramps
    if not ramps:  # thresholds 0, 122 and 366 samples: steps at 0, 32, 64, 96, 128 (64), 192, 256, 320, 384 (128)
        assert got["steps"]["megatron_counts"] == [2] * 4 + [4] * 4 + [8] * 4
        assert "2 at first: --step-batch-size-schedule '0:32,1M:64,3M:128'" in got["steps"]["describe"]


def test_model_config_carries_zeppelin_spec(worker_result: dict) -> None:
    mc = worker_result["model_config"]
    if mc is None:
        pytest.skip("this Megatron-LM builds the model through model_provider (no GPTModelConfig)")
    assert mc["layer_spec"] == "zeppelin_megatron.megatron.pretrain.zeppelin_layer_spec"
    assert mc["pre_wrap_hooks"][-1] == "zeppelin_megatron.megatron.pretrain.prepare_model_chunks"
    assert mc["container_model_is_it"] is True


@pytest.mark.parametrize(
    "name, match",
    [
        ("pp", "--pipeline-model-parallel-size 2"),
        ("cp", "--context-parallel-size 2: Zeppelin replaces context parallelism"),
        ("hybrid_cp", "--hybrid-context-parallel"),
        ("cluster", "32 GPUs but the job has world size 16"),
        ("profile", "does not exist"),
        ("eval", "--valid-data-path"),
        ("dataloader", "--dataloader-type cyclic"),
        ("attention_backend", "--attention-backend local"),
        ("cuda_graph", "--cuda-graph-impl local: a CUDA graph replays fixed shapes"),
        ("attention_dropout", "--attention-dropout 0.1: Zeppelin attention has no attention dropout"),
        ("window", "--window-size (4096, 0): sliding-window attention is not supported"),
        ("tp_comm_overlap", "--tp-comm-overlap: Transformer Engine's TP communication/GEMM overlap"),
        ("full_validation", "--full-validation"),
    ],
)
def test_unservable_configs_rejected_by_startup_check(worker_result: dict, name: str, match: str) -> None:
    msg = worker_result["errors"][name]
    assert msg is not None, f"{name}: accepted"
    assert match in msg


def test_recipes_pass_megatron_and_zeppelin_checks(worker_result: dict) -> None:
    r = worker_result["recipe"]
    mock = r.pop("smoke_gpt.sh mock")  # DATA_PREFIX=mock: Megatron's --mock-data, a NullTokenizer, no files
    assert (mock["mock_data"], mock["data_path"], mock["tokenizer_type"]) == (True, [], "NullTokenizer")
    assert set(r) == {p.name for p in (REPO / "configs" / "recipes").glob("*.sh")}
    for name, got in r.items():
        assert got["cluster"].startswith("4x8@") and got["cluster"].endswith("configs/clusters/h100.yaml"), name
        assert got["data_path"] == ["0.3", "/data/web_text_document", "0.7", "/data/code"], name  # a blend
    seven, thirteen = r["llama7b_4x8_h100.sh"], r["llama13b_4x8_h100_tp2.sh"]
    assert (seven["global_batch_size"], seven["data_parallel_size"], seven["seq_length"]) == (64, 32, 65536)
    assert (thirteen["tensor_parallel"], thirteen["data_parallel_size"], thirteen["num_layers"]) == (2, 16, 40)
    assert thirteen["global_batch_size"] == 32  # 2 micro-steps of 16 Zeppelin ranks
