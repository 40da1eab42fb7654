"""A new user's first hour (issue 14, item 5): every mistake is one clear line and exit code 2, before any work."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from zeppelin_megatron.cli import main
from zeppelin_megatron.planner import CostModel, load_cluster, load_model
from zeppelin_megatron.planner.profile import default_profile

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/models/tiny.yaml"
BATCH_1M = ROOT / "configs/batches/long_tailed_1m.txt"
UNREADABLE = "/proc/self/mem"      # exists, is a file, reading it fails (EIO) even as root
UNWRITABLE_DIR = Path("/proc")      # exists, is a directory, no file can be created in it even as root


@pytest.fixture
def lengths(tmp_path: Path) -> Path:
    f = tmp_path / "lengths.txt"
    f.write_text("3000\n500\n120\n")
    return f


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> str:
    """Run the CLI; assert exit code 2, the message on one stderr line, and no work done (nothing on stdout)."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "wrote" not in out and "rank" not in out, out   # checked before any planning / measuring
    return err


@pytest.mark.parametrize("flag", ["--json", "--plot"])
@pytest.mark.parametrize("where, message", [
    ("missing/out.x", "directory {tmp}/missing does not exist"),
    (".", "is a directory, expected a file name"),
    ("UNWRITABLE", "cannot write in directory /proc"),
])
def test_plan_output_paths(tmp_path: Path, lengths: Path, capsys: pytest.CaptureFixture[str], flag: str,
                           where: str, message: str) -> None:
    path = str(UNWRITABLE_DIR / "zeppelin.out") if where == "UNWRITABLE" else str(tmp_path / where)
    _fails(capsys, ["plan", "--lengths", str(lengths), "--cluster", "1x4", flag, path],
           message.format(tmp=tmp_path))


def test_other_commands_output_paths(tmp_path: Path, lengths: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nowhere" / "x.json")
    _fails(capsys, ["simulate", "--lengths", str(lengths), "--cluster", "1x4", "--steps", "1", "--tokens-per-step",
                    "100", "--timeline", missing], "--timeline")
    _fails(capsys, ["simulate", "--dist", "arxiv-64k", "--cluster", "1x4", "--json", str(tmp_path)],
           "is a directory")
    _fails(capsys, ["replay", "--lengths", str(lengths), "--cluster", "1x4", "--model", str(TINY), "--json",
                    missing], "directory")
    _fails(capsys, ["profile", "--out", str(UNWRITABLE_DIR / "p.json"), "--device", "cpu"], "cannot write in")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _fails(capsys, ["demo", "--out", str(blocker)], "--out " + str(blocker) + ": is a file, expected a directory")
    _fails(capsys, ["demo", "--out", str(tmp_path / "d"), "--json", missing], "--json")


@pytest.mark.parametrize("flag", ["--lengths", "--profile", "--model"])
def test_unreadable_and_directory_inputs(tmp_path: Path, lengths: Path, capsys: pytest.CaptureFixture[str],
                                         flag: str) -> None:
    base = {"--lengths": str(lengths), "--profile": None, "--model": None}
    for value, message in ((UNREADABLE, f"{flag} {UNREADABLE}: cannot be read"),
                           (str(tmp_path), f"{flag} {tmp_path}: is a directory, expected a file"),
                           (str(tmp_path / "none"), "file does not exist")):
        args = dict(base, **{flag: value})
        argv = ["plan", "--cluster", "1x4"] + [x for k, v in args.items() if v is not None for x in (k, v)]
        _fails(capsys, argv, message)


def test_cluster_shape_and_file(tmp_path: Path, lengths: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["plan", "--lengths", str(lengths), "--cluster", "4x0"], "GPUs per node is 0, expected at least 1")
    _fails(capsys, ["plan", "--lengths", str(lengths), "--cluster", "0x8"], "node count is 0, expected at least 1")
    _fails(capsys, ["plan", "--lengths", str(lengths), "--cluster", f"2x8@{tmp_path}"], "is a directory")
    _fails(capsys, ["simulate", "--dist", "arxiv-64k", "--cluster", "4x0"], "GPUs per node is 0")


def test_lengths_file_content(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "batch.bin"
    binary.write_bytes(b"\x00\x01\x02\x03" * 8)
    _fails(capsys, ["plan", "--lengths", str(binary), "--cluster", "1x4"], f"lengths file '{binary}' is binary")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"100\n\xe9\n")
    _fails(capsys, ["plan", "--lengths", str(latin), "--cluster", "1x4"], f"'{latin}' is not UTF-8 text")
    negative = tmp_path / "neg.txt"
    negative.write_text("# header\n100\n-5\n")
    _fails(capsys, ["plan", "--lengths", str(negative), "--cluster", "1x4"], f"{negative}:3: length -5 must be >= 1")
    _fails(capsys, ["simulate", "--lengths", str(negative), "--cluster", "1x4"], f"{negative}:3: length -5")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    _fails(capsys, ["plan", "--lengths", str(empty), "--cluster", "1x4"], "holds no lengths")


def test_plot_needs_matplotlib_before_work(lengths: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # "not installed": importing it raises ImportError
    _fails(capsys, ["plan", "--lengths", str(lengths), "--cluster", "1x4", "--plot", str(tmp_path / "p.png")],
           "--plot needs matplotlib: pip install 'zeppelin_megatron[plot]'")
    _fails(capsys, ["simulate", "--lengths", str(lengths), "--cluster", "1x4", "--steps", "1", "--tokens-per-step",
                    "100", "--timeline", str(tmp_path / "t.png")], "--timeline needs matplotlib")


def test_cost_model_with_a_name_instead_of_a_shape() -> None:
    with pytest.raises(TypeError, match=r"CostModel model is the str 'llama_7b', expected a ModelShape"):
        CostModel(model="llama_7b", cluster=load_cluster("1x2"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"CostModel cluster is the str '1x2', expected a Cluster"):
        CostModel(model=load_model(None), cluster="1x2")  # type: ignore[arg-type]


def _table_rows(text: str) -> list[list[str]]:
    return [ln.split() for ln in text.splitlines() if ln[:4].strip().isdigit()]


def test_table_exposed_column_matches_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes
    bars: dict[str, list[float]] = {}
    real_bar = Axes.bar

    def spy(self, x, height, *args, **kwargs):  # type: ignore[no-untyped-def]
        bars[kwargs.get("label", "")] = [float(h) for h in height]
        return real_bar(self, x, height, *args, **kwargs)

    monkeypatch.setattr(Axes, "bar", spy)
    out = tmp_path / "plan.json"
    assert main(["plan", "--lengths", str(BATCH_1M), "--cluster", f"4x8@{ROOT / 'configs/clusters/h100.yaml'}",
                 "--json", str(out), "--plot", str(tmp_path / "p.png"), "--no-packed"]) == 0  # a plan that remaps
    text = capsys.readouterr().out
    pred = json.loads(out.read_text())["predicted"]
    assert pred["remap_ms"] > 0
    column = [float(r[6]) for r in _table_rows(text)]
    expected = [e + pred["remap_ms"] for e in pred["exposed_comm_ms"]]
    assert column == pytest.approx(expected, abs=0.06)
    assert bars["exposed comm (ring waits + remap)"] == pytest.approx(expected, abs=1e-6)
    assert min(column) > 0   # before: 0.0 on ranks whose only exposed time is the remap
    # ~1M tokens on 32 GPUs: hundreds of GB per rank and step, shown in GB (not 341412.2 MB)
    assert "intra GB" in text and "inter GB" in text and "GB sent per step" in text
    intra = [float(r[7]) for r in _table_rows(text)]
    assert intra == pytest.approx([m / 1000 for m in pred["intra_MB"]], abs=0.06)


def test_small_traffic_stays_in_MB(lengths: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--lengths", str(lengths), "--cluster", "1x4"]) == 0
    assert "intra MB" in capsys.readouterr().out


def _short_profile(tmp_path: Path, top: int) -> Path:
    doc = default_profile().to_dict()
    doc["attention"]["rows"] = [r for r in doc["attention"]["rows"] if r["seqlen"] <= top]
    doc.pop("ring_blocks", None)
    f = tmp_path / f"profile_{top}.json"
    f.write_text(json.dumps(doc))
    return f


def test_plan_warns_when_the_profile_stops_short(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths = tmp_path / "l.txt"
    lengths.write_text("100000\n500\n")
    assert main(["plan", "--lengths", str(lengths), "--cluster", "2x8", "--profile",
                 str(_short_profile(tmp_path, 256))]) == 0
    err = capsys.readouterr().err
    assert "warning: the profile measured attention up to 256 tokens but the longest sequence has 100000" in err
    assert main(["plan", "--lengths", str(lengths), "--cluster", "2x8", "--profile",
                 str(_short_profile(tmp_path, 32768))]) == 0
    assert "warning" not in capsys.readouterr().err


def test_replay_labels_a_cpu_run_against_a_gpu_profile(tmp_path: Path, lengths: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    lengths.write_text("60\n20\n9\n3\n")
    common = ["replay", "--lengths", str(lengths), "--cluster", "1x2", "--model", str(TINY), "--device", "cpu",
              "--repeats", "1", "--warmup", "0", "--quiet", "--strategies", "zeppelin"]
    out = tmp_path / "r.json"
    assert main([*common, "--json", str(out)]) == 0     # bundled H100 profile
    text = capsys.readouterr().out
    assert text.count("NOT COMPARABLE") == 2 and "NVIDIA H100" in text
    assert json.loads(out.read_text())["profile"]["same_device"] is False
    cpu = default_profile().to_dict()
    cpu["device"] = "CPU x86_64 (1 threads)"
    prof = tmp_path / "cpu.json"
    prof.write_text(json.dumps(cpu))
    assert main([*common, "--profile", str(prof), "--json", str(out)]) == 0
    assert "NOT COMPARABLE" not in capsys.readouterr().out
    assert json.loads(out.read_text())["profile"]["same_device"] is True


def test_profile_quick_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zeppelin_megatron.measure.profiler as profiler
    seen = {}

    def fake(opts, **_):  # type: ignore[no-untyped-def]
        seen["opts"] = opts
        return {"device": "CPU", "measurement": {"backend": "reference"}}

    monkeypatch.setattr(profiler, "measure_profile", fake)
    assert main(["profile", "--quick", "--device", "cpu", "--out", str(tmp_path / "p.json")]) == 0
    o = seen["opts"]
    assert (o.lengths, o.linear_tokens, o.repeats, o.warmup, o.blocks) == ((64, 128, 256), (64, 256), 3, 1, False)
    assert main(["profile", "--quick", "--repeats", "5", "--device", "cpu", "--out", str(tmp_path / "p.json")]) == 0
    assert seen["opts"].repeats == 5    # explicit flags win
    assert main(["profile", "--device", "cpu", "--out", str(tmp_path / "p.json")]) == 0
    assert (seen["opts"].repeats, seen["opts"].warmup, seen["opts"].blocks) == (10, 3, True)


def test_binary_json_and_yaml_inputs_are_named(tmp_path: Path, lengths: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    blob = tmp_path / "blob.json"
    blob.write_bytes(bytes(range(128, 256)))
    _fails(capsys, ["plan", "--lengths", str(lengths), "--cluster", "1x4", "--profile", str(blob)],
           f"--profile {blob}: not a text file (byte 0 is 0x80, not UTF-8)")
    _fails(capsys, ["plan", "--lengths", str(lengths), "--cluster", str(blob)], f"--cluster {blob}: not a text file")
    broken = tmp_path / "plan.json"
    broken.write_text("{")
    _fails(capsys, ["replay", "--plan", str(broken), "--model", str(TINY), "--device", "cpu"],
           f"--plan {broken}: plan is not valid JSON")
