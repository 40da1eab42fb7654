"""benchmarks/write_benchmarks_md.py: splices generated sections between their markers, each alone or both."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _writer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("write_benchmarks_md", ROOT / "benchmarks" / "write_benchmarks_md.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


writer = _writer()
DOC = ("intro\n<!-- BEGIN simulate_tables -->\nold tables\n<!-- END simulate_tables -->\nmiddle\n"
       "<!-- BEGIN sensitivity -->\nold sens\n<!-- END sensitivity -->\nend\n")


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    doc, tables, sens = tmp_path / "B.md", tmp_path / "sim.md", tmp_path / "sens.md"
    doc.write_text(DOC)
    tables.write_text("new tables\n")
    sens.write_text("new sens\n")
    return doc, tables, sens


def test_sensitivity_alone_leaves_the_tables(tmp_path: Path) -> None:
    doc, _, sens = _files(tmp_path)
    writer.main(["--sensitivity", str(sens)], doc=doc)
    text = doc.read_text()
    assert "old tables" in text and "new sens" in text and "old sens" not in text
    assert text.startswith("intro\n") and text.endswith("end\n")


def test_tables_and_sensitivity(tmp_path: Path) -> None:
    doc, tables, sens = _files(tmp_path)
    writer.main([str(tables), "--sensitivity", str(sens)], doc=doc)
    text = doc.read_text()
    assert "new tables" in text and "new sens" in text and "old" not in text


def test_nothing_given_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    doc, _, _ = _files(tmp_path)
    with pytest.raises(SystemExit):
        writer.main([], doc=doc)
    assert doc.read_text() == DOC


def test_empty_input_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    doc, _, sens = _files(tmp_path)
    sens.write_text("  \n")
    with pytest.raises(SystemExit, match="sensitivity are empty"):
        writer.main(["--sensitivity", str(sens)], doc=doc)
    assert doc.read_text() == DOC
