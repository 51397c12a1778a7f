"""``privzo`` commands: one module per command family over shared argument helpers
(``arguments``), with the process's environment policy in ``process``."""

from privzo.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
