"""Splice the output of simulate_tables.py into docs/BENCHMARKS.md (between the markers).

Run: python benchmarks/simulate_tables.py > /tmp/sim.md && python benchmarks/write_benchmarks_md.py /tmp/sim.md
Only the text between ``<!-- BEGIN simulate_tables -->`` and ``<!-- END simulate_tables -->`` changes.
"""

from __future__ import annotations

import sys
from pathlib import Path

BEGIN, END = "<!-- BEGIN simulate_tables -->", "<!-- END simulate_tables -->"


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: write_benchmarks_md.py TABLES.md")
    doc = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    tables = Path(sys.argv[1]).read_text().strip()
    doc.write_text(f"{head}{BEGIN}\n{tables}\n{END}{tail}")
    print(f"updated {doc}")


if __name__ == "__main__":
    main()
