"""``python run_script.py [--mcore-main-compat] SCRIPT ARGS...``: run SCRIPT as ``python SCRIPT ARGS`` would.

With ``--mcore-main-compat`` it first installs :mod:`mcore_main_compat` (Megatron-LM main
on the newest released megatron-core) and prints what it added to stderr.
"""

from __future__ import annotations

import os
import runpy
import sys

if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--mcore-main-compat":
        args = args[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import mcore_main_compat

        added = mcore_main_compat.install()
        del sys.path[0]
        print(f"mcore-main-compat: added {', '.join(added) or 'nothing'}", file=sys.stderr, flush=True)
    script = os.path.abspath(args[0])
    sys.argv = [script, *args[1:]]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
