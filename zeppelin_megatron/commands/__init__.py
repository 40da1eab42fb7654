"""Subcommands of the ``zeppelin`` CLI: one module each, with ``HELP``, ``add_arguments`` and ``run``.

Modules import their heavy dependencies (torch, megatron, matplotlib) inside
``run`` so that ``zeppelin --help`` and unrelated subcommands stay fast.
"""
