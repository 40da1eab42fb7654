"""Splice generated tables into docs/BENCHMARKS.md (between their markers).

Run::

    python benchmarks/simulate_tables.py --jobs 2 > /tmp/sim.md
    python benchmarks/sensitivity.py --configs ... > /tmp/sens.md
    python benchmarks/write_benchmarks_md.py /tmp/sim.md [--sensitivity /tmp/sens.md]
    python benchmarks/write_benchmarks_md.py --sensitivity /tmp/sens.md   # the sensitivity section alone

Only the text between ``<!-- BEGIN simulate_tables -->`` and ``<!-- END simulate_tables -->`` (when the
tables are given) and between ``<!-- BEGIN sensitivity -->`` and ``<!-- END sensitivity -->`` (with
``--sensitivity``) changes, so the sensitivity runs (about 18 minutes) can be refreshed without the
tables (about 50). A missing marker, an empty input or no input at all is an error naming it; nothing is
written then.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def splice(text: str, section: str, tables: str) -> str:
    """``text`` with the part between ``section``'s markers replaced by ``tables``.

    >>> splice("a <!-- BEGIN x -->old<!-- END x --> b", "x", "new")
    'a <!-- BEGIN x -->\\nnew\\n<!-- END x --> b'
    """
    begin, end = f"<!-- BEGIN {section} -->", f"<!-- END {section} -->"
    if begin not in text or end not in text:
        raise SystemExit(f"docs/BENCHMARKS.md has no {begin} ... {end} markers")
    if not tables.strip():
        raise SystemExit(f"the tables for {section} are empty: not written")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{tables.strip()}\n{end}{tail}"


def main(argv: list[str] | None = None, doc: Path | None = None) -> None:
    """Splice the given outputs into ``doc`` (default: this checkout's docs/BENCHMARKS.md)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="?", default=None, help="output of benchmarks/simulate_tables.py")
    ap.add_argument("--sensitivity", default=None, help="output of benchmarks/sensitivity.py")
    args = ap.parse_args(argv)
    if args.tables is None and args.sensitivity is None:
        ap.error("nothing to write: give the tables (simulate_tables.py's output), --sensitivity, or both")
    doc = doc or Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"
    text = doc.read_text()
    if args.tables:
        text = splice(text, "simulate_tables", Path(args.tables).read_text())
    if args.sensitivity:
        text = splice(text, "sensitivity", Path(args.sensitivity).read_text())
    doc.write_text(text)
    print(f"updated {doc}")


if __name__ == "__main__":
    main()
